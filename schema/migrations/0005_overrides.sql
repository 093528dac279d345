-- 0005: the override audit, one row per override event (created, deleted, expired) published
-- on quotaflow.overrides.<action> by the admin API, the automatic policies and the rule
-- store's expiry watcher: who changed what, when, why. event_id is the event's id (its
-- Nats-Msg-Id); override_id the override's. target is "subject", "tier" or "rule". The
-- aggregators' events consumer looks each event_id up before inserting it. Partitioned by
-- month, kept a year.
CREATE TABLE IF NOT EXISTS {{local "overrides"}}{{.OnCluster}} (
    event_id String,
    action {{.String}},
    at {{.Time}},
    actor String,
    override_id String,
    target {{.String}},
    dimension {{.String}},
    identifier String,
    tier {{.String}},
    rule_id {{.String}},
    limit_value Int64,
    multiplier Float64,
    reason String,
    creator String,
    source {{.String}},
    created_at DateTime,
    expires_at DateTime,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = {{engine "MergeTree" "overrides"}}
PARTITION BY toYYYYMM(at)
ORDER BY (override_id, at)
{{- if .Modern}}
TTL toDateTime(at) + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "overrides"}}
