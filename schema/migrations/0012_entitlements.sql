-- 0012: entitlements (issue 41). entitlement_events holds the thresholds of entitlements that
-- subjects' balances crossed (quotaflow.entitlements.<kind>: used_percent, balance_below,
-- grant_expiring), one row per event, event_id its Nats-Msg-Id (the crossing decision's id with
-- the threshold), which the aggregators' events consumer looks up before inserting it.
-- webhook_deliveries is the delivery log of the webhook endpoints: one row per attempt to
-- deliver an event (message_id, the webhook-id) to an endpoint, its HTTP status, outcome
-- (delivered, retry, gave up, failed) and error. Both partitioned by day, kept 90 days.
CREATE TABLE IF NOT EXISTS {{local "entitlement_events"}}{{.OnCluster}} (
    event_id String,
    at {{.Time}},
    kind {{.String}},
    entitlement {{.String}},
    dimension {{.String}},
    subject String,
    tier {{.String}},
    threshold Int64,
    grant_id String,
    used Int64,
    remaining Int64,
    period_end DateTime,
    decision_id String,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = {{engine "MergeTree" "entitlement_events"}}
PARTITION BY toDate(at)
ORDER BY (entitlement, subject, at, event_id)
{{- if .Modern}}
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "entitlement_events"}}
CREATE TABLE IF NOT EXISTS {{local "webhook_deliveries"}}{{.OnCluster}} (
    at {{.Time}},
    endpoint {{.String}},
    message_id String,
    attempt UInt32,
    status UInt16,
    outcome {{.String}},
    error String,
    duration_ms UInt32,
    next_ms UInt64
) ENGINE = {{engine "MergeTree" "webhook_deliveries"}}
PARTITION BY toDate(at)
ORDER BY (endpoint, at, message_id)
{{- if .Modern}}
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed "webhook_deliveries"}}
