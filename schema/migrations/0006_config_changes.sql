-- 0006: the configuration audit, one row per configuration change published on
-- quotaflow.config.<action> by the rule store: the rules document applied (rules_applied) or
-- seeded from a rules file (rules_seeded, actor "seed"), a rule created, replaced or deleted,
-- a user's tier set. actor is the admin API token's name; target the rule's id or the user's
-- ("" for the whole document); tier the tier set; detail what was written, as JSON (the rule,
-- the rule removed, the user, the document). event_id is the event's id (its Nats-Msg-Id),
-- which the aggregators' events consumer looks up before inserting it. Overrides have their
-- own audit (0005). Partitioned by month, kept a year.
CREATE TABLE IF NOT EXISTS {{local "config_changes"}}{{.OnCluster}} (
    event_id String,
    at {{.Time}},
    action {{.String}},
    actor String,
    target String,
    tier {{.String}},
    detail String,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = {{engine "MergeTree" "config_changes"}}
PARTITION BY toYYYYMM(at)
ORDER BY (at, event_id)
{{- if .Modern}}
TTL toDateTime(at) + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "config_changes"}}
