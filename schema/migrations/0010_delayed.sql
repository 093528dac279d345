-- 0010: delayed checks, an outcome of their own (issue 25): a rule with on_limit: delay allows
-- a check past its limit after a wait instead of denying it. decisions.delay_us is that wait in µs
-- (the answer's delay_us; 0 for every other decision, and every row before this migration),
-- and the rollups count delayed_requests: allowed checks and reserves that waited, counted among
-- allowed_requests too. Added as in 0007 (one ALTER per table; 18.16 has no ADD COLUMN IF NOT
-- EXISTS, and the runner takes a column that exists for added; on a cluster the Distributed
-- tables made again), and the usage views re-created with the new counter: between the DROP
-- and the CREATE of one view (during the upgrade only) rows inserted elsewhere miss the
-- rollups; migrate before the aggregators insert, as they do at start.
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}delay_us Int64 DEFAULT 0;
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
{{- range .Rollups}}
ALTER TABLE {{local .Table}}{{$.OnCluster}} ADD COLUMN {{$ine}}delayed_requests UInt64 DEFAULT 0;
{{- if $.OnCluster}}
DROP TABLE IF EXISTS {{$.DB}}.usage_{{.Name}}{{$.OnCluster}};
{{distributed .Table}}
{{- end}}
DROP TABLE IF EXISTS {{$.DB}}.usage_{{.Name}}_mv{{$.OnCluster}};
CREATE MATERIALIZED VIEW IF NOT EXISTS {{$.DB}}.usage_{{.Name}}_mv{{$.OnCluster}} TO {{local .Table}} AS
SELECT
    {{.Bucket}} AS {{.Name}},
    tier,
    subject_dimension AS dimension,
    endpoint,
    rule_id,
    countIf(kind = '' OR kind = 'reserve') AS requests,
    sumIf(allowed, kind = '' OR kind = 'reserve') AS allowed_requests,
    countIf(allowed = 0 AND (kind = '' OR kind = 'reserve')) AS denied_requests,
    sumIf(shadow, kind = '' OR kind = 'reserve') AS shadow_denied,
    sum(cost) AS cost_total,
    sum(cost * allowed) AS allowed_cost,
    sumIf(estimated_cost, kind = 'reserve' AND allowed = 1) AS reserved_cost,
    sumIf(cost, kind = 'settle' OR kind = 'cancel') AS settle_delta,
    countIf(kind = 'settle' OR kind = 'cancel') AS settles,
    countIf(overage = 1) AS overages,
    countIf(lease_id != '' AND allowed = 1 AND (kind = '' OR kind = 'reserve')) AS leases_acquired,
    countIf(kind = 'lease_release') AS leases_released,
    countIf(kind = 'lease_expired') AS leases_expired,
    countIf(delay_us > 0 AND allowed = 1 AND (kind = '' OR kind = 'reserve')) AS delayed_requests
FROM {{local "decisions"}}
GROUP BY {{.Name}}, tier, dimension, endpoint, rule_id;
{{end}}
