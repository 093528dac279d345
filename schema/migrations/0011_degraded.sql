-- 0011: decisions answered by a fail mode, counted apart (issue 26). A check or reserve whose
-- Redis call failed, timed out or was shed is answered by its rules' fail_mode
-- (decisions.degraded = 1, since 0001): allowed (open, local) or denied (closed). Those denials
-- are no throttling, yet until now the rollups counted them among denied_requests only, so that
-- a Redis outage read as a rule denying everyone. The rollups count degraded_requests (checks
-- and reserves answered by a fail mode, allowed or denied) and degraded_denied (those denied);
-- both are counted among allowed_requests and denied_requests too, as before, so that existing
-- queries keep their meaning, and the limits' own denials are denied_requests -
-- degraded_denied. Rows written before this migration read 0 in both (the column's default,
-- before and after their parts merge): the audit's degraded column tells them apart. Added as
-- in 0007 (one ALTER per table; 18.16 has no ADD COLUMN IF NOT EXISTS, and the runner takes a
-- column that exists for added; on a cluster the Distributed tables made again), and the usage
-- views re-created with the new counters: between the DROP and the CREATE of one view (during
-- the upgrade only) rows inserted elsewhere miss the rollups; migrate before the aggregators
-- insert, as they do at start.
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
{{- range .Rollups}}
ALTER TABLE {{local .Table}}{{$.OnCluster}} ADD COLUMN {{$ine}}degraded_requests UInt64 DEFAULT 0,
    ADD COLUMN {{$ine}}degraded_denied UInt64 DEFAULT 0;
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
    countIf(delay_us > 0 AND allowed = 1 AND (kind = '' OR kind = 'reserve')) AS delayed_requests,
    countIf(degraded = 1 AND (kind = '' OR kind = 'reserve')) AS degraded_requests,
    countIf(degraded = 1 AND allowed = 0 AND (kind = '' OR kind = 'reserve')) AS degraded_denied
FROM {{local "decisions"}}
GROUP BY {{.Name}}, tier, dimension, endpoint, rule_id;
{{end}}
