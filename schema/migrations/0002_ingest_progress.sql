-- 0002: the highest stream sequence stored per partition, written by the same INSERT that
-- stores the decisions (through a materialized view), so that an aggregator taking over a
-- partition, or retrying after a failure, skips what is already in ClickHouse.
CREATE TABLE IF NOT EXISTS {{.DB}}.ingest_progress (
    partition UInt16,
    last_seq AggregateFunction(max, UInt64)
) ENGINE = AggregatingMergeTree
ORDER BY partition;

CREATE MATERIALIZED VIEW IF NOT EXISTS {{.DB}}.ingest_progress_mv TO {{.DB}}.ingest_progress AS
SELECT partition, maxState(stream_seq) AS last_seq
FROM {{.DB}}.decisions
GROUP BY partition;
