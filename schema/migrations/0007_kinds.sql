-- 0007: what a decision row records, and the fields of reservations and leases (issue 23).
-- kind is '' for a check (every row before this migration, and every check since), 'reserve'
-- for a check charging an estimate (estimated_cost = cost, reservation_id when allowed),
-- 'settle' or 'cancel' for a reservation settled later (cost = actual_cost - estimated_cost,
-- what it charged; overage when it went past a limit), 'lease_release' or 'lease_expired' for a
-- concurrency lease released by its holder or found expired (lease_id; an allowed check's row
-- carries its lease_id too).
-- ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS: there the migration runner takes a column
-- that already exists (this migration run again, or by two aggregators at once) for added.
-- One ALTER adds all of a table's columns at once (it is atomic, and only this migration adds
-- them), so that a column found means all of them are there; one statement, not one per
-- column, also spares a cluster a round of its DDL queue per column. On a cluster the
-- Distributed table (which only readers use: the aggregators insert into decisions_local) is
-- made again from decisions_local, since 18.16 refuses an ALTER ON CLUSTER of a Distributed
-- table over replicated shards (code 371).
-- The usage views are re-created so that only checks and reserves count as requests, while
-- every row's cost counts: a reservation's rollup cost is its settled cost. The rollups get
-- reserved_cost (allowed reserves' estimates), settle_delta (what their settles and cancels
-- charged: reserved_cost + settle_delta is what reservations cost once settled, an unsettled
-- one at its estimate), settles, overages, and leases acquired, released and found expired;
-- on a cluster their Distributed tables are made again, as decisions'. Between the DROP
-- and the CREATE of one view (during the upgrade only) rows inserted elsewhere miss the
-- rollups; migrate before the aggregators insert, as they do at start.
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}kind {{.String}} DEFAULT '',
    ADD COLUMN {{$ine}}reservation_id String DEFAULT '',
    ADD COLUMN {{$ine}}estimated_cost Int64 DEFAULT 0,
    ADD COLUMN {{$ine}}actual_cost Int64 DEFAULT 0,
    ADD COLUMN {{$ine}}overage UInt8 DEFAULT 0,
    ADD COLUMN {{$ine}}lease_id String DEFAULT '';
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
{{- range .Rollups}}
ALTER TABLE {{local .Table}}{{$.OnCluster}} ADD COLUMN {{$ine}}reserved_cost Int64 DEFAULT 0,
    ADD COLUMN {{$ine}}settle_delta Int64 DEFAULT 0,
    ADD COLUMN {{$ine}}settles UInt64 DEFAULT 0,
    ADD COLUMN {{$ine}}overages UInt64 DEFAULT 0,
    ADD COLUMN {{$ine}}leases_acquired UInt64 DEFAULT 0,
    ADD COLUMN {{$ine}}leases_released UInt64 DEFAULT 0,
    ADD COLUMN {{$ine}}leases_expired UInt64 DEFAULT 0;
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
    countIf(kind = 'lease_expired') AS leases_expired
FROM {{local "decisions"}}
GROUP BY {{.Name}}, tier, dimension, endpoint, rule_id;
{{end}}
