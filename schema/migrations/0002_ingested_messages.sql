-- 0002: the stream messages stored, one row per (partition, stream sequence), written by the
-- same INSERT that stores their decisions (through a materialized view). The aggregator looks
-- up each fetched message here before inserting it, so a redelivered or re-consumed message
-- is skipped instead of stored twice. Kept 7 days (longer than the stream keeps a message).
CREATE TABLE IF NOT EXISTS {{local "ingested_messages"}}{{.OnCluster}} (
    partition UInt16,
    stream_seq UInt64,
    day Date,
    decisions UInt64
) ENGINE = {{engine "MergeTree" "ingested_messages"}}
PARTITION BY day
ORDER BY (partition, stream_seq)
{{- if .Modern}}
TTL day + INTERVAL 7 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "ingested_messages"}}

CREATE MATERIALIZED VIEW IF NOT EXISTS {{.DB}}.ingested_messages_mv{{.OnCluster}} TO {{local "ingested_messages"}} AS
SELECT partition, stream_seq, toDate(ingested_at) AS day, count() AS decisions
FROM {{local "decisions"}}
GROUP BY partition, stream_seq, day;
