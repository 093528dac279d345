#!/usr/bin/env bash
# Measures quotaflow backtest on a recorded hour of the docs/performance.md size: a ClickHouse of
# its own, the schema migrated, N decisions (default 36,000,000: an hour at 10k/s) of 10,000
# users spread evenly over an hour that ended 10 minutes ago, inserted by ClickHouse itself,
# then one backtest of that hour under deploy/bench/backtest-rules.yaml (a token bucket and a
# fixed window per user, a global GCRA), timed with its peak memory (GNU time's maximum RSS).
# Usage: deploy/bench/backtest.sh [decisions, default 36000000]
# USERS (10000) sets the distinct users, RULES (deploy/bench/backtest-rules.yaml) the rules file,
# QUOTAFLOW_BIN another binary to run the backtest with (an older build, to compare), and
# BACKTEST_FLAGS more flags of quotaflow backtest: e.g. the attack of many rules on "*" over many
# distinct checks, at a checker's bounds (docs/backtest.md):
#   USERS=500000 RULES=<100 rules on *> BACKTEST_FLAGS=--checker-bounds deploy/bench/backtest.sh 2000000
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-36000000}"
USERS="${USERS:-10000}"
RULES="${RULES:-deploy/bench/backtest-rules.yaml}"
BIN="${QUOTAFLOW_BIN:-./bin/quotaflow}"
PORT=19096
make -s build
dir=$(mktemp -d)
cleanup() {
  [ -n "${ch:-}" ] && kill "$ch" 2>/dev/null && wait "$ch" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
deploy/dev/clickhouse-config.sh "$dir" "$PORT" $((PORT + 1))
(cd "$dir" && exec "$(command -v clickhouse-server || echo /usr/sbin/clickhouse-server)" --config-file="$dir/config.xml" >"$dir/stdout.log" 2>&1) &
ch=$!
for _ in $(seq 300); do clickhouse-client --port "$PORT" -q "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
dsn="clickhouse://127.0.0.1:$PORT/bt"
./bin/quotaflow migrate --clickhouse-dsn "$dsn" >/dev/null

end=$(( $(date +%s) - 600 ))
start=$(( end - 3600 ))
echo "== inserting $N decisions over $(date -u -d @"$start" +%FT%TZ) to $(date -u -d @"$end" +%FT%TZ)"
t0=$(date +%s.%N)
clickhouse-client --port "$PORT" --max_insert_block_size 1048576 -q "
INSERT INTO bt.decisions (id, time, time_us, subject_dimension, subject_id, subjects, tier, endpoint, rule_id,
    algorithm, cost, allowed, partition, stream_seq, batch_id, ingested_at)
SELECT toString(number), toDateTime(intDiv(us, 1000000)), us, 'user', u, ['user:' || u], 'free', '/api/items',
    'user-minute', 'token_bucket', 1, number % 10 != 0, 0, number, '', now()
FROM (SELECT number, toInt64($start) * 1000000 + intDiv(number * 3600000000, $N) AS us,
             concat('u', toString(number * 7919 % $USERS)) AS u
      FROM numbers($N))"
echo "inserted in $(echo "$(date +%s.%N) - $t0" | bc) s; on disk: $(clickhouse-client --port "$PORT" -q "SELECT formatReadableSize(sum(bytes)) FROM system.parts WHERE database = 'bt' AND table = 'decisions' AND active")"

echo "== quotaflow backtest of the hour"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=$(ticks "$ch")
/usr/bin/time -f "quotaflow: elapsed %e s, user %U s, system %S s, max RSS %M KiB" \
  "$BIN" backtest --clickhouse-dsn "$dsn" --rules "$RULES" ${BACKTEST_FLAGS:-} \
    --from "$(date -u -d @"$start" +%FT%TZ)" --to "$(date -u -d @"$end" +%FT%TZ)" --warmup -1s --top 3
echo "clickhouse-server meanwhile: $(echo "scale=1; ($(ticks "$ch") - $before) / $(getconf CLK_TCK)" | bc) s of CPU"
