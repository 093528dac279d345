#!/usr/bin/env bash
# `make dev`: checks that its ports are free, builds bin/quotaflow, starts Redis and ClickHouse
# (Debian's packages, data under .dev/) and `quotaflow serve` (checker, publisher, aggregator
# and an embedded NATS with JetStream, data under .dev/) with deploy/dev/rules.yaml, prints
# where everything listens once serve is ready, and stops all of it on Ctrl-C or when serve
# exits. Redis or ClickHouse stopping is reported and the rest keeps running: the pipeline
# copes (ClickHouse down: decisions wait in the stream).
#
# The ports, each from an environment variable (listed in docs/configuration.md, "make dev"):
#   QUOTAFLOW_LISTEN                    127.0.0.1:8080  the check API, admin API, /metrics
#   QUOTAFLOW_NATS_LISTEN               127.0.0.1:4222  the embedded NATS server
#   QUOTAFLOW_DEV_REDIS_PORT            6390            Redis on 127.0.0.1
#   QUOTAFLOW_DEV_CLICKHOUSE_PORT       9000            ClickHouse's native protocol
#   QUOTAFLOW_DEV_CLICKHOUSE_HTTP_PORT  8123            ClickHouse's HTTP interface
#   QUOTAFLOW_DEV_DIR                   .dev            where the data and logs go
set -euo pipefail
cd "$(dirname "$0")/../.."

DEV_DIR="${QUOTAFLOW_DEV_DIR:-.dev}"
REDIS_PORT="${QUOTAFLOW_DEV_REDIS_PORT:-6390}"
LISTEN="${QUOTAFLOW_LISTEN:-127.0.0.1:8080}"
NATS_LISTEN="${QUOTAFLOW_NATS_LISTEN:-127.0.0.1:4222}"
CH_PORT="${QUOTAFLOW_DEV_CLICKHOUSE_PORT:-9000}"
CH_HTTP_PORT="${QUOTAFLOW_DEV_CLICKHOUSE_HTTP_PORT:-8123}"

# Every port must be free before anything starts: a port in use would otherwise show up as a
# server that exits seconds after the banner, or worse, as another process answering for it.
busy=()
in_use() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
for spec in "QUOTAFLOW_LISTEN=$LISTEN" "QUOTAFLOW_NATS_LISTEN=$NATS_LISTEN" \
  "QUOTAFLOW_DEV_REDIS_PORT=127.0.0.1:$REDIS_PORT" "QUOTAFLOW_DEV_CLICKHOUSE_PORT=127.0.0.1:$CH_PORT" \
  "QUOTAFLOW_DEV_CLICKHOUSE_HTTP_PORT=127.0.0.1:$CH_HTTP_PORT"; do
  var="${spec%%=*}" addr="${spec#*=}"
  host="${addr%:*}" port="${addr##*:}"
  if in_use "${host:-127.0.0.1}" "$port"; then busy+=("  $addr is in use (set $var to another)"); fi
done
if ((${#busy[@]})); then
  printf 'dev: cannot start, ports in use:\n' >&2
  printf '%s\n' "${busy[@]}" >&2
  printf 'dev: stop what holds them (ss -ltnp shows it), or choose other ports, e.g. QUOTAFLOW_LISTEN=127.0.0.1:18080 make dev\n' >&2
  exit 1
fi

# A first build compiles every dependency: about a minute, which would look like a hang.
if [[ ! -x bin/quotaflow ]]; then
  echo "dev: building bin/quotaflow (the first build compiles every dependency: a minute or so)"
else
  echo "dev: building bin/quotaflow"
fi
"${GO:-go}" build -buildvcs=auto -o bin/quotaflow ./cmd/quotaflow

mkdir -p "$DEV_DIR/redis" "$DEV_DIR/clickhouse"
REDIS_DIR="$(cd "$DEV_DIR/redis" && pwd)" # absolute: QUOTAFLOW_DEV_DIR may be either
CH_DIR="$(cd "$DEV_DIR/clickhouse" && pwd)"
CH_BIN="$(command -v clickhouse-server || echo /usr/sbin/clickhouse-server)"

pids=()
declare -A names # pid → what it runs, for the message when one stops
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "dev: stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# Ctrl-C (or a TERM) is how `make dev` is meant to end: a clean stop, exit status 0, so that
# make reports no error.
trap 'cleanup; echo "dev: stopped"; exit 0' INT TERM

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DEV_DIR/redis" \
  --appendonly yes --save "" --logfile "$REDIS_DIR/redis.log" &
pids+=($!) names[$!]="redis (log $DEV_DIR/redis/redis.log)"
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "dev: redis did not start; see $DEV_DIR/redis/redis.log" >&2; exit 1; }

# A loopback-only ClickHouse with its data, logs and config under .dev/clickhouse.
deploy/dev/clickhouse-config.sh "$CH_DIR" "$CH_PORT" "$CH_HTTP_PORT"
(cd "$CH_DIR" && exec "$CH_BIN" --config-file="$CH_DIR/config.xml" >"$CH_DIR/stdout.log" 2>&1) &
pids+=($!) names[$!]="clickhouse (log $CH_DIR/error.log)"
for _ in $(seq 300); do
  clickhouse-client --port "$CH_PORT" -q "SELECT 1" >/dev/null 2>&1 && break
  sleep 0.1
done
clickhouse-client --port "$CH_PORT" -q "SELECT 1" >/dev/null || { echo "dev: clickhouse did not start; see $CH_DIR/error.log" >&2; exit 1; }

export QUOTAFLOW_CLICKHOUSE_DSN="clickhouse://127.0.0.1:$CH_PORT/quotaflow"
export QUOTAFLOW_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export QUOTAFLOW_RULES="deploy/dev/rules.yaml"
export QUOTAFLOW_LISTEN="$LISTEN"
# The terminal plays the gateway in the tour: forward-auth believes X-Forwarded-For, X-Real-Ip
# and X-Client-Ip from loopback only (a real deployment lists its proxies' networks).
export QUOTAFLOW_TRUSTED_PROXIES="${QUOTAFLOW_TRUSTED_PROXIES:-127.0.0.1/32,::1/128}"
export QUOTAFLOW_NATS_LISTEN="$NATS_LISTEN"
export QUOTAFLOW_NATS_DIR="$DEV_DIR/nats"
export QUOTAFLOW_SPOOL_DIR="$DEV_DIR/spool"
# Webhook endpoints on this machine (a receiver under development) are allowed in dev only.
export QUOTAFLOW_WEBHOOK_ALLOW_HOSTS="${QUOTAFLOW_WEBHOOK_ALLOW_HOSTS:-127.0.0.1,localhost}"
ADMIN_TOKEN="${QUOTAFLOW_ADMIN_TOKEN:-dev-admin-token}"
./bin/quotaflow serve --admin-token "$ADMIN_TOKEN" &
serve=$!
pids+=("$serve") names[$serve]="quotaflow serve"
# Ready means /readyz answers 200: the rules loaded, Redis and NATS reachable.
echo "dev: waiting for quotaflow serve to be ready (GET http://$LISTEN/readyz)"
for _ in $(seq 600); do
  curl -fsS "http://$LISTEN/readyz" >/dev/null 2>&1 && break
  kill -0 "$serve" 2>/dev/null || { wait "$serve" && rc=0 || rc=$?; echo "dev: quotaflow serve exited ($rc) before it was ready; its log is above" >&2; exit 1; }
  sleep 0.1
done
if ! curl -fsS "http://$LISTEN/readyz" >/dev/null 2>&1; then
  echo "dev: quotaflow serve not ready after 60s: $(curl -sS "http://$LISTEN/readyz" 2>&1)" >&2
  exit 1
fi

cat <<MSG

quotaflow dev is ready (Ctrl-C stops everything):
  checker  http://$LISTEN   Connect, gRPC, gRPC-Web, GET /ratelimit/check, /healthz, /readyz
  admin    http://$LISTEN/api/v1   token: $ADMIN_TOKEN   (rules, tiers and overrides in NATS KV)
  console  http://$LISTEN/console/   sign in with the admin token: live transitions, usage, subjects, overrides
  nats     nats://$NATS_LISTEN   streams QUOTAFLOW_DECISIONS (quotaflow.decisions.>) and QUOTAFLOW_EVENTS
           (quotaflow.warnings.<tier>.<dimension>, quotaflow.overrides.<action>); data in $DEV_DIR/nats;
           quotaflow's users only, a seed per role in $DEV_DIR/nats/auth (read-only: operator.nk,
           what watch, top and status use by default from .dev/)
  redis    $QUOTAFLOW_REDIS_URL   (data in $DEV_DIR/redis)
  clickhouse $QUOTAFLOW_CLICKHOUSE_DSN   native protocol; clickhouse-client --port $CH_PORT (data in $DEV_DIR/clickhouse)
  aggregator  runs inside serve: decisions into quotaflow.decisions and the usage_* rollups,
              warning states and their events, policies, events into state_transitions and overrides
  rules    $QUOTAFLOW_RULES
  spool    $QUOTAFLOW_SPOOL_DIR   (decisions wait here while NATS is unreachable)

Try:
  curl -s -H 'Content-Type: application/json' http://$LISTEN/quotaflow.v1.RateLimiter/CheckRateLimit \\
    -d '{"identifier":"alice","dimension":"DIMENSION_USER","endpoint":"/api/v1/orders"}'
  ./bin/quotaflow check --user alice --endpoint /api/v1/orders
  ./bin/quotaflow watch decisions          # the live decision stream
  ./bin/quotaflow watch warnings           # normal/warning/throttled transitions as they happen
  export QUOTAFLOW_ADMIN_TOKEN=$ADMIN_TOKEN
  ./bin/quotaflow override set --user alice --limit 500 --duration 10m --reason demo
  ./bin/quotaflow rules list
  clickhouse-client --port $CH_PORT -q 'SELECT tier, count() FROM quotaflow.decisions GROUP BY tier'

MSG
# Only serve ending ends the stack; Redis or ClickHouse stopping is said, and the rest runs on.
while true; do
  dead=""
  wait -n -p dead "${pids[@]}" && rc=0 || rc=$?
  [[ -n "$dead" ]] || continue # a trapped signal interrupted wait
  if [[ "$dead" == "$serve" ]]; then
    echo "dev: quotaflow serve exited ($rc); stopping the rest" >&2
    exit "$rc"
  fi
  echo "dev: ${names[$dead]} stopped ($rc); quotaflow serve keeps running without it (its log says how it copes); Ctrl-C stops everything" >&2
  alive=()
  for pid in "${pids[@]}"; do [[ "$pid" == "$dead" ]] || alive+=("$pid"); done
  pids=("${alive[@]}")
done
