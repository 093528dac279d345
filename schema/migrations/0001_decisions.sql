-- 0001: the decision audit, one row per decision, every field of the quotaflow.v1.Decision
-- event plus where it came from in the stream (partition, stream_seq, batch_id).
-- Partitioned by day so that retention drops whole days; ordered for the analysts' queries
-- (a tier's or a subject's decisions over time). Kept 90 days: TTL on current servers, the
-- aggregator's retention job (DROP PARTITION) everywhere. On a cluster (schema.Layout) the
-- rows go to decisions_local, replicated, and decisions is the Distributed table reading them;
-- its last 1000 insert blocks' hashes let a retried insert be dropped on every server.
CREATE TABLE IF NOT EXISTS {{local "decisions"}}{{.OnCluster}} (
    id String,
    checker_id {{.String}},
    time {{.Time}},
    time_us Int64,
    subject_dimension {{.String}},
    subject_id String,
    subjects Array(String),
    tier {{.String}},
    endpoint {{.String}},
    rule_id {{.String}},
    algorithm {{.String}},
    cost Int64,
    allowed UInt8,
    shadow UInt8,
    degraded UInt8,
    fail_mode {{.String}},
    limit_value Int64,
    remaining Int64,
    current_count Int64,
    window_ms Int64,
    reset_at DateTime,
    retry_after_ms Int64,
    state {{.State}},
    replayed UInt8,
    clock_skew_ms Int64,
    limits Nested(
        rule_id String,
        dimension String,
        identifier String,
        endpoint String,
        algorithm String,
        limit_value Int64,
        window_ms Int64,
        allowed UInt8,
        current_count Int64,
        remaining Int64,
        reset_at DateTime,
        retry_after_ms Int64,
        shadow UInt8,
        state {{.State}},
        degraded UInt8,
        fail_mode String,
        burst Int64
    ),
    partition UInt16,
    stream_seq UInt64,
    batch_id String,
    ingested_at DateTime
) ENGINE = {{engine "MergeTree" "decisions"}}
PARTITION BY toDate(time)
ORDER BY (tier, subject_dimension, subject_id, time)
{{- if .Modern}}
TTL toDateTime(time) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1, {{dedupWindow}}
{{- else if .OnCluster}}
SETTINGS {{dedupWindow}}
{{- end}};
{{distributed "decisions"}}
