#!/usr/bin/env bash
# `make dev`: starts Redis (data under .dev/) and `quotaflow serve` (checker, publisher and an
# embedded NATS with JetStream, data under .dev/) with deploy/dev/rules.yaml, prints where
# everything listens, and stops all of it on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEV_DIR="${QUOTAFLOW_DEV_DIR:-.dev}"
REDIS_PORT="${QUOTAFLOW_DEV_REDIS_PORT:-6390}"
LISTEN="${QUOTAFLOW_LISTEN:-127.0.0.1:8080}"
NATS_LISTEN="${QUOTAFLOW_NATS_LISTEN:-127.0.0.1:4222}"
mkdir -p "$DEV_DIR/redis"

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "dev: stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DEV_DIR/redis" \
  --appendonly yes --save "" --logfile "$PWD/$DEV_DIR/redis/redis.log" &
pids+=($!)
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "dev: redis did not start; see $DEV_DIR/redis/redis.log" >&2; exit 1; }

export QUOTAFLOW_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export QUOTAFLOW_RULES="deploy/dev/rules.yaml"
export QUOTAFLOW_LISTEN="$LISTEN"
export QUOTAFLOW_NATS_LISTEN="$NATS_LISTEN"
export QUOTAFLOW_NATS_DIR="$DEV_DIR/nats"
export QUOTAFLOW_SPOOL_DIR="$DEV_DIR/spool"
./bin/quotaflow serve &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

cat <<MSG

quotaflow dev is running (Ctrl-C stops everything):
  checker  http://$LISTEN   Connect, gRPC, gRPC-Web, GET /ratelimit/check, /healthz, /readyz
  nats     nats://$NATS_LISTEN   JetStream stream QUOTAFLOW_DECISIONS, subjects quotaflow.decisions.> (data in $DEV_DIR/nats)
  redis    $QUOTAFLOW_REDIS_URL   (data in $DEV_DIR/redis)
  rules    $QUOTAFLOW_RULES
  spool    $QUOTAFLOW_SPOOL_DIR   (decisions wait here while NATS is unreachable)

Try:
  curl -s -H 'Content-Type: application/json' http://$LISTEN/quotaflow.v1.RateLimiter/CheckRateLimit \\
    -d '{"identifier":"alice","dimension":"DIMENSION_USER","endpoint":"/api/v1/orders"}'
  ./bin/quotaflow check --user alice --endpoint /api/v1/orders
  ./bin/quotaflow watch decisions          # the live decision stream

MSG
wait -n "${pids[@]}"
