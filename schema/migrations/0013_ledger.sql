-- 0013: the grant ledger (issue 41). A balance's moves come in two streams: the grants made and
-- voided, as config events (config_changes, action grant_issued or grant_voided, whose detail
-- carries the grant, what a void forfeited, and the balance's period), and what checks,
-- settles and recorded usage did to the grants, as the decisions' ledger entries (a Nested
-- column added here: burned, overage, given_back, overage_back, forfeited, reissued,
-- rolled_over; decisions written before have none). Two views copy both into ledger, one row
-- per move, its amount signed (what it added to the grant's remainder), so that every grant's
-- remainder, a balance (the sum over its live grants) and a period's usage can be recomputed
-- from ClickHouse alone (docs/queries.md). Both sources are stored exactly once, so the ledger
-- is. The ledger is kept for good: no TTL, no retention job (docs/entitlements.md, "The
-- ledger"). Partitioned by the month of the balance's period.
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}ledger.entitlement Array(String),
    ADD COLUMN {{$ine}}ledger.dimension Array(String),
    ADD COLUMN {{$ine}}ledger.subject Array(String),
    ADD COLUMN {{$ine}}ledger.kind Array(String),
    ADD COLUMN {{$ine}}ledger.grant_id Array(String),
    ADD COLUMN {{$ine}}ledger.amount Array(Int64),
    ADD COLUMN {{$ine}}ledger.period_start Array(DateTime),
    ADD COLUMN {{$ine}}ledger.period_end Array(DateTime);
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
CREATE TABLE IF NOT EXISTS {{local "ledger"}}{{.OnCluster}} (
    at {{.Time}},
    entitlement {{.String}},
    dimension {{.String}},
    subject String,
    kind {{.String}},
    grant_id String,
    amount Int64,
    period_start DateTime,
    period_end DateTime,
    effective_ms Int64,
    expires_ms Int64,
    source String
) ENGINE = {{engine "MergeTree" "ledger"}}
PARTITION BY toYYYYMM(period_start)
ORDER BY (entitlement, subject, grant_id, at, kind);
{{distributed "ledger"}}
CREATE MATERIALIZED VIEW IF NOT EXISTS {{.DB}}.ledger_decisions_mv{{.OnCluster}} TO {{local "ledger"}} AS
SELECT
    time AS at,
    l_entitlement AS entitlement,
    l_dimension AS dimension,
    l_subject AS subject,
    l_kind AS kind,
    l_grant AS grant_id,
    l_amount AS amount,
    l_start AS period_start,
    l_end AS period_end,
    if(l_kind = 'rolled_over', toInt64(toUInt32(l_start)) * 1000, toInt64(0)) AS effective_ms,
    if(l_kind = 'rolled_over', toInt64(toUInt32(l_end)) * 1000, toInt64(0)) AS expires_ms,
    id AS source
FROM {{local "decisions"}}
ARRAY JOIN ledger.entitlement AS l_entitlement, ledger.dimension AS l_dimension, ledger.subject AS l_subject,
    ledger.kind AS l_kind, ledger.grant_id AS l_grant, ledger.amount AS l_amount,
    ledger.period_start AS l_start, ledger.period_end AS l_end;
CREATE MATERIALIZED VIEW IF NOT EXISTS {{.DB}}.ledger_grants_mv{{.OnCluster}} TO {{local "ledger"}} AS
SELECT
    at,
    visitParamExtractString(detail, 'entitlement') AS entitlement,
    visitParamExtractString(detail, 'dimension') AS dimension,
    visitParamExtractString(detail, 'subject') AS subject,
    if(action = 'grant_issued', 'issued', 'voided') AS kind,
    target AS grant_id,
    if(action = 'grant_issued', visitParamExtractInt(detail, 'amount'), -visitParamExtractInt(detail, 'forfeited')) AS amount,
    toDateTime(visitParamExtractUInt(detail, 'period_start_s')) AS period_start,
    toDateTime(visitParamExtractUInt(detail, 'period_end_s')) AS period_end,
    visitParamExtractInt(detail, 'effective_ms') AS effective_ms,
    visitParamExtractInt(detail, 'expires_ms') AS expires_ms,
    event_id AS source
FROM {{local "config_changes"}}
WHERE action IN ('grant_issued', 'grant_voided');
