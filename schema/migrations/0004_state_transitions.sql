-- 0004: warning-state transitions (seed 000's state machine: normal, warning, throttled), one
-- row per transition event the aggregators publish on quotaflow.warnings.<tier>.<dimension>,
-- stored by the aggregators' events consumer, which looks each id up before inserting it.
-- at is the transition's instant (the decision's time, or a timer's); at_us keeps its
-- microseconds where the legacy DateTime cannot. cause is "decision" or "timer"; stream_seq is
-- the event's sequence in QUOTAFLOW_EVENTS. Partitioned by day, kept 90 days.
CREATE TABLE IF NOT EXISTS {{local "state_transitions"}}{{.OnCluster}} (
    id String,
    at {{.Time}},
    at_us Int64,
    tier {{.String}},
    dimension {{.String}},
    subject String,
    rule_id {{.String}},
    from_state {{.State}},
    to_state {{.State}},
    usage_ratio Float64,
    limit_value Int64,
    remaining Int64,
    window_ms Int64,
    cause {{.String}},
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = {{engine "MergeTree" "state_transitions"}}
PARTITION BY toDate(at)
ORDER BY (tier, dimension, subject, rule_id, at)
{{- if .Modern}}
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "state_transitions"}}
