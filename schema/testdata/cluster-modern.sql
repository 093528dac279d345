CREATE TABLE IF NOT EXISTS quotaflow.decisions_local ON CLUSTER 'qf' (
    id String,
    checker_id LowCardinality(String),
    time DateTime64(6, 'UTC'),
    time_us Int64,
    subject_dimension LowCardinality(String),
    subject_id String,
    subjects Array(String),
    tier LowCardinality(String),
    endpoint LowCardinality(String),
    rule_id LowCardinality(String),
    algorithm LowCardinality(String),
    cost Int64,
    allowed UInt8,
    shadow UInt8,
    degraded UInt8,
    fail_mode LowCardinality(String),
    limit_value Int64,
    remaining Int64,
    current_count Int64,
    window_ms Int64,
    reset_at DateTime,
    retry_after_ms Int64,
    state Enum8('unspecified' = 0, 'normal' = 1, 'warning' = 2, 'throttled' = 3),
    replayed UInt8,
    clock_skew_ms Int64,
    limits Nested(
        rule_id String,
        dimension String,
        identifier String,
        endpoint String,
        algorithm String,
        limit_value Int64,
        window_ms Int64,
        allowed UInt8,
        current_count Int64,
        remaining Int64,
        reset_at DateTime,
        retry_after_ms Int64,
        shadow UInt8,
        state Enum8('unspecified' = 0, 'normal' = 1, 'warning' = 2, 'throttled' = 3),
        degraded UInt8,
        fail_mode String,
        burst Int64
    ),
    partition UInt16,
    stream_seq UInt64,
    batch_id String,
    ingested_at DateTime
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/decisions_local', '{replica}')
PARTITION BY toDate(time)
ORDER BY (tier, subject_dimension, subject_id, time)
TTL toDateTime(time) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1, replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

CREATE TABLE IF NOT EXISTS quotaflow.ingested_messages_local ON CLUSTER 'qf' (
    partition UInt16,
    stream_seq UInt64,
    day Date,
    decisions UInt64
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/ingested_messages_local', '{replica}')
PARTITION BY day
ORDER BY (partition, stream_seq)
TTL day + INTERVAL 7 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.ingested_messages ON CLUSTER 'qf' AS quotaflow.ingested_messages_local
ENGINE = Distributed('qf', 'quotaflow', 'ingested_messages_local', rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.ingested_messages_mv ON CLUSTER 'qf' TO quotaflow.ingested_messages_local AS
SELECT partition, stream_seq, toDate(ingested_at) AS day, count() AS decisions
FROM quotaflow.decisions_local
GROUP BY partition, stream_seq, day;

CREATE TABLE IF NOT EXISTS quotaflow.usage_minute_local ON CLUSTER 'qf' (
    minute DateTime,
    tier LowCardinality(String),
    dimension LowCardinality(String),
    endpoint LowCardinality(String),
    rule_id LowCardinality(String),
    requests UInt64,
    allowed_requests UInt64,
    denied_requests UInt64,
    shadow_denied UInt64,
    cost_total Int64,
    allowed_cost Int64
) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/quotaflow/usage_minute_local', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (tier, dimension, endpoint, rule_id, minute)
TTL minute + INTERVAL 30 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.usage_minute ON CLUSTER 'qf' AS quotaflow.usage_minute_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_minute_local', rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf' TO quotaflow.usage_minute_local AS
SELECT
    toStartOfMinute(time) AS minute,
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
FROM quotaflow.decisions_local
GROUP BY minute, tier, dimension, endpoint, rule_id;

CREATE TABLE IF NOT EXISTS quotaflow.usage_hour_local ON CLUSTER 'qf' (
    hour DateTime,
    tier LowCardinality(String),
    dimension LowCardinality(String),
    endpoint LowCardinality(String),
    rule_id LowCardinality(String),
    requests UInt64,
    allowed_requests UInt64,
    denied_requests UInt64,
    shadow_denied UInt64,
    cost_total Int64,
    allowed_cost Int64
) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/quotaflow/usage_hour_local', '{replica}')
PARTITION BY toYYYYMM(hour)
ORDER BY (tier, dimension, endpoint, rule_id, hour)
TTL hour + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.usage_hour ON CLUSTER 'qf' AS quotaflow.usage_hour_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_hour_local', rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf' TO quotaflow.usage_hour_local AS
SELECT
    toStartOfHour(time) AS hour,
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
FROM quotaflow.decisions_local
GROUP BY hour, tier, dimension, endpoint, rule_id;

CREATE TABLE IF NOT EXISTS quotaflow.usage_day_local ON CLUSTER 'qf' (
    day Date,
    tier LowCardinality(String),
    dimension LowCardinality(String),
    endpoint LowCardinality(String),
    rule_id LowCardinality(String),
    requests UInt64,
    allowed_requests UInt64,
    denied_requests UInt64,
    shadow_denied UInt64,
    cost_total Int64,
    allowed_cost Int64
) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/quotaflow/usage_day_local', '{replica}')
PARTITION BY toYYYYMM(day)
ORDER BY (tier, dimension, endpoint, rule_id, day)
TTL toDateTime(day) + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.usage_day ON CLUSTER 'qf' AS quotaflow.usage_day_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_day_local', rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf' TO quotaflow.usage_day_local AS
SELECT
    toDate(time) AS day,
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
FROM quotaflow.decisions_local
GROUP BY day, tier, dimension, endpoint, rule_id;

CREATE TABLE IF NOT EXISTS quotaflow.state_transitions_local ON CLUSTER 'qf' (
    id String,
    at DateTime64(6, 'UTC'),
    at_us Int64,
    tier LowCardinality(String),
    dimension LowCardinality(String),
    subject String,
    rule_id LowCardinality(String),
    from_state Enum8('unspecified' = 0, 'normal' = 1, 'warning' = 2, 'throttled' = 3),
    to_state Enum8('unspecified' = 0, 'normal' = 1, 'warning' = 2, 'throttled' = 3),
    usage_ratio Float64,
    limit_value Int64,
    remaining Int64,
    window_ms Int64,
    cause LowCardinality(String),
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/state_transitions_local', '{replica}')
PARTITION BY toDate(at)
ORDER BY (tier, dimension, subject, rule_id, at)
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.state_transitions ON CLUSTER 'qf' AS quotaflow.state_transitions_local
ENGINE = Distributed('qf', 'quotaflow', 'state_transitions_local', rand());

CREATE TABLE IF NOT EXISTS quotaflow.overrides_local ON CLUSTER 'qf' (
    event_id String,
    action LowCardinality(String),
    at DateTime64(6, 'UTC'),
    actor String,
    override_id String,
    target LowCardinality(String),
    dimension LowCardinality(String),
    identifier String,
    tier LowCardinality(String),
    rule_id LowCardinality(String),
    limit_value Int64,
    multiplier Float64,
    reason String,
    creator String,
    source LowCardinality(String),
    created_at DateTime,
    expires_at DateTime,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/overrides_local', '{replica}')
PARTITION BY toYYYYMM(at)
ORDER BY (override_id, at)
TTL toDateTime(at) + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.overrides ON CLUSTER 'qf' AS quotaflow.overrides_local
ENGINE = Distributed('qf', 'quotaflow', 'overrides_local', rand());

CREATE TABLE IF NOT EXISTS quotaflow.config_changes_local ON CLUSTER 'qf' (
    event_id String,
    at DateTime64(6, 'UTC'),
    action LowCardinality(String),
    actor String,
    target String,
    tier LowCardinality(String),
    detail String,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/config_changes_local', '{replica}')
PARTITION BY toYYYYMM(at)
ORDER BY (at, event_id)
TTL toDateTime(at) + INTERVAL 365 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.config_changes ON CLUSTER 'qf' AS quotaflow.config_changes_local
ENGINE = Distributed('qf', 'quotaflow', 'config_changes_local', rand());

ALTER TABLE quotaflow.decisions_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS kind LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS reservation_id String DEFAULT '',
    ADD COLUMN IF NOT EXISTS estimated_cost Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS actual_cost Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS overage UInt8 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS lease_id String DEFAULT '';

DROP TABLE IF EXISTS quotaflow.decisions ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

ALTER TABLE quotaflow.usage_minute_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS reserved_cost Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settle_delta Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settles UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS overages UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_acquired UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_released UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_expired UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_minute ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_minute ON CLUSTER 'qf' AS quotaflow.usage_minute_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_minute_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf' TO quotaflow.usage_minute_local AS
SELECT
    toStartOfMinute(time) AS minute,
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
FROM quotaflow.decisions_local
GROUP BY minute, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_hour_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS reserved_cost Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settle_delta Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settles UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS overages UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_acquired UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_released UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_expired UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_hour ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_hour ON CLUSTER 'qf' AS quotaflow.usage_hour_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_hour_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf' TO quotaflow.usage_hour_local AS
SELECT
    toStartOfHour(time) AS hour,
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
FROM quotaflow.decisions_local
GROUP BY hour, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_day_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS reserved_cost Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settle_delta Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS settles UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS overages UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_acquired UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_released UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases_expired UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_day ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_day ON CLUSTER 'qf' AS quotaflow.usage_day_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_day_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf' TO quotaflow.usage_day_local AS
SELECT
    toDate(time) AS day,
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
FROM quotaflow.decisions_local
GROUP BY day, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.decisions_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS exemption String DEFAULT '';

DROP TABLE IF EXISTS quotaflow.decisions ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

ALTER TABLE quotaflow.decisions_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS `limits.candidate_of` Array(String) AFTER `limits.burst`;

DROP TABLE IF EXISTS quotaflow.decisions ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

ALTER TABLE quotaflow.decisions_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS delay_us Int64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.decisions ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

ALTER TABLE quotaflow.usage_minute_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS delayed_requests UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_minute ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_minute ON CLUSTER 'qf' AS quotaflow.usage_minute_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_minute_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf' TO quotaflow.usage_minute_local AS
SELECT
    toStartOfMinute(time) AS minute,
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
FROM quotaflow.decisions_local
GROUP BY minute, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_hour_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS delayed_requests UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_hour ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_hour ON CLUSTER 'qf' AS quotaflow.usage_hour_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_hour_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf' TO quotaflow.usage_hour_local AS
SELECT
    toStartOfHour(time) AS hour,
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
FROM quotaflow.decisions_local
GROUP BY hour, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_day_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS delayed_requests UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_day ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_day ON CLUSTER 'qf' AS quotaflow.usage_day_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_day_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf' TO quotaflow.usage_day_local AS
SELECT
    toDate(time) AS day,
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
FROM quotaflow.decisions_local
GROUP BY day, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_minute_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS degraded_requests UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS degraded_denied UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_minute ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_minute ON CLUSTER 'qf' AS quotaflow.usage_minute_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_minute_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_minute_mv ON CLUSTER 'qf' TO quotaflow.usage_minute_local AS
SELECT
    toStartOfMinute(time) AS minute,
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
FROM quotaflow.decisions_local
GROUP BY minute, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_hour_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS degraded_requests UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS degraded_denied UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_hour ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_hour ON CLUSTER 'qf' AS quotaflow.usage_hour_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_hour_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_hour_mv ON CLUSTER 'qf' TO quotaflow.usage_hour_local AS
SELECT
    toStartOfHour(time) AS hour,
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
FROM quotaflow.decisions_local
GROUP BY hour, tier, dimension, endpoint, rule_id;

ALTER TABLE quotaflow.usage_day_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS degraded_requests UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS degraded_denied UInt64 DEFAULT 0;

DROP TABLE IF EXISTS quotaflow.usage_day ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.usage_day ON CLUSTER 'qf' AS quotaflow.usage_day_local
ENGINE = Distributed('qf', 'quotaflow', 'usage_day_local', rand());

DROP TABLE IF EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf';

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.usage_day_mv ON CLUSTER 'qf' TO quotaflow.usage_day_local AS
SELECT
    toDate(time) AS day,
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
FROM quotaflow.decisions_local
GROUP BY day, tier, dimension, endpoint, rule_id;

CREATE TABLE IF NOT EXISTS quotaflow.entitlement_events_local ON CLUSTER 'qf' (
    event_id String,
    at DateTime64(6, 'UTC'),
    kind LowCardinality(String),
    entitlement LowCardinality(String),
    dimension LowCardinality(String),
    subject String,
    tier LowCardinality(String),
    threshold Int64,
    grant_id String,
    used Int64,
    remaining Int64,
    period_end DateTime,
    decision_id String,
    stream_seq UInt64,
    ingested_at DateTime
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/entitlement_events_local', '{replica}')
PARTITION BY toDate(at)
ORDER BY (entitlement, subject, at, event_id)
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.entitlement_events ON CLUSTER 'qf' AS quotaflow.entitlement_events_local
ENGINE = Distributed('qf', 'quotaflow', 'entitlement_events_local', rand());

CREATE TABLE IF NOT EXISTS quotaflow.webhook_deliveries_local ON CLUSTER 'qf' (
    at DateTime64(6, 'UTC'),
    endpoint LowCardinality(String),
    message_id String,
    attempt UInt32,
    status UInt16,
    outcome LowCardinality(String),
    error String,
    duration_ms UInt32,
    next_ms UInt64
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/webhook_deliveries_local', '{replica}')
PARTITION BY toDate(at)
ORDER BY (endpoint, at, message_id)
TTL toDateTime(at) + INTERVAL 90 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS quotaflow.webhook_deliveries ON CLUSTER 'qf' AS quotaflow.webhook_deliveries_local
ENGINE = Distributed('qf', 'quotaflow', 'webhook_deliveries_local', rand());

ALTER TABLE quotaflow.decisions_local ON CLUSTER 'qf' ADD COLUMN IF NOT EXISTS ledger.entitlement Array(String),
    ADD COLUMN IF NOT EXISTS ledger.dimension Array(String),
    ADD COLUMN IF NOT EXISTS ledger.subject Array(String),
    ADD COLUMN IF NOT EXISTS ledger.kind Array(String),
    ADD COLUMN IF NOT EXISTS ledger.grant_id Array(String),
    ADD COLUMN IF NOT EXISTS ledger.amount Array(Int64),
    ADD COLUMN IF NOT EXISTS ledger.period_start Array(DateTime),
    ADD COLUMN IF NOT EXISTS ledger.period_end Array(DateTime);

DROP TABLE IF EXISTS quotaflow.decisions ON CLUSTER 'qf';

CREATE TABLE IF NOT EXISTS quotaflow.decisions ON CLUSTER 'qf' AS quotaflow.decisions_local
ENGINE = Distributed('qf', 'quotaflow', 'decisions_local', rand());

CREATE TABLE IF NOT EXISTS quotaflow.ledger_local ON CLUSTER 'qf' (
    at DateTime64(6, 'UTC'),
    entitlement LowCardinality(String),
    dimension LowCardinality(String),
    subject String,
    kind LowCardinality(String),
    grant_id String,
    amount Int64,
    period_start DateTime,
    period_end DateTime,
    effective_ms Int64,
    expires_ms Int64,
    source String
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/quotaflow/ledger_local', '{replica}')
PARTITION BY toYYYYMM(period_start)
ORDER BY (entitlement, subject, grant_id, at, kind);

CREATE TABLE IF NOT EXISTS quotaflow.ledger ON CLUSTER 'qf' AS quotaflow.ledger_local
ENGINE = Distributed('qf', 'quotaflow', 'ledger_local', rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.ledger_decisions_mv ON CLUSTER 'qf' TO quotaflow.ledger_local AS
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
FROM quotaflow.decisions_local
ARRAY JOIN ledger.entitlement AS l_entitlement, ledger.dimension AS l_dimension, ledger.subject AS l_subject,
    ledger.kind AS l_kind, ledger.grant_id AS l_grant, ledger.amount AS l_amount,
    ledger.period_start AS l_start, ledger.period_end AS l_end;

CREATE MATERIALIZED VIEW IF NOT EXISTS quotaflow.ledger_grants_mv ON CLUSTER 'qf' TO quotaflow.ledger_local AS
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
FROM quotaflow.config_changes_local
WHERE action IN ('grant_issued', 'grant_voided');

