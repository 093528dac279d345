-- 0003: usage rollups per minute (kept 30 days), hour and day (kept a year) × tier ×
-- dimension × endpoint × rule, fed by materialized views on decisions. SummingMergeTree
-- sums rows of one key when parts merge, so queries must still sum(): rows of one key may
-- not be merged yet. Aggregate aliases differ from source column names (allowed_requests,
-- cost_total, ...): ClickHouse 18.16 rejects `sum(allowed) AS allowed` in a view (code 184).
{{- range .Rollups}}
CREATE TABLE IF NOT EXISTS {{local .Table}}{{$.OnCluster}} (
    {{.Name}} {{.Type}},
    tier {{$.String}},
    dimension {{$.String}},
    endpoint {{$.String}},
    rule_id {{$.String}},
    requests UInt64,
    allowed_requests UInt64,
    denied_requests UInt64,
    shadow_denied UInt64,
    cost_total Int64,
    allowed_cost Int64
) ENGINE = {{engine "SummingMergeTree" .Table}}
PARTITION BY {{.Partition}}
ORDER BY (tier, dimension, endpoint, rule_id, {{.Name}})
{{- if $.Modern}}
TTL {{.TTLTime}} + INTERVAL {{.Days}} DAY
SETTINGS ttl_only_drop_parts = 1
{{- end}};
{{distributed .Table}}

CREATE MATERIALIZED VIEW IF NOT EXISTS {{$.DB}}.usage_{{.Name}}_mv{{$.OnCluster}} TO {{local .Table}} AS
SELECT
    {{.Bucket}} AS {{.Name}},
    tier,
    subject_dimension AS dimension,
    endpoint,
    rule_id,
    count() AS requests,
    sum(allowed) AS allowed_requests,
    countIf(allowed = 0) AS denied_requests,
    sum(shadow) AS shadow_denied,
    sum(cost) AS cost_total,
    sum(cost * allowed) AS allowed_cost
FROM {{local "decisions"}}
GROUP BY {{.Name}}, tier, dimension, endpoint, rule_id;
{{end}}
