-- 0007: what a decision row records, and the fields of reservations and leases (issue 23).
-- kind is '' for a check (every row before this migration, and every check since), 'reserve'
-- for a check charging an estimate (estimated_cost = cost, reservation_id when allowed),
-- 'settle' or 'cancel' for a reservation settled later (cost = actual_cost - estimated_cost,
-- what it charged; overage when it went past a limit), 'lease_release' or 'lease_expired' for a
-- concurrency lease released by its holder or found expired (lease_id; an allowed check's row
-- carries its lease_id too).
-- ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS: there the migration runner takes a column
-- that already exists (this migration run again, or by two aggregators at once) for added.
-- One column per statement, so that each is added or found on its own. On a cluster the
-- Distributed table (which only readers use: the aggregators insert into decisions_local) is
-- made again from decisions_local, since 18.16 refuses an ALTER ON CLUSTER of a Distributed
-- table over replicated shards (code 371).
-- The usage views are re-created so that only checks and reserves count as requests, while
-- every row's cost counts: a reservation's rollup cost is its settled cost. Between the DROP
-- and the CREATE of one view (during the upgrade only) rows inserted elsewhere miss the
-- rollups; migrate before the aggregators insert, as they do at start.
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}kind {{.String}} DEFAULT '';
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}reservation_id String DEFAULT '';
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}estimated_cost Int64 DEFAULT 0;
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}actual_cost Int64 DEFAULT 0;
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}overage UInt8 DEFAULT 0;
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}lease_id String DEFAULT '';
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
{{- range .Rollups}}
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
    sum(cost * allowed) AS allowed_cost
FROM {{local "decisions"}}
GROUP BY {{.Name}}, tier, dimension, endpoint, rule_id;
{{end}}
