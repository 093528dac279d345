#!/usr/bin/env bash
# `make dev`: starts Redis (data under .dev/) and the checker with deploy/dev/rules.yaml, prints
# where everything listens, and stops all of it on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEV_DIR="${QUOTAFLOW_DEV_DIR:-.dev}"
REDIS_PORT="${QUOTAFLOW_DEV_REDIS_PORT:-6390}"
LISTEN="${QUOTAFLOW_LISTEN:-127.0.0.1:8080}"
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
./bin/quotaflow checker &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://$LISTEN/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

cat <<MSG

quotaflow dev is running (Ctrl-C stops everything):
  checker  http://$LISTEN   Connect, gRPC, gRPC-Web, GET /ratelimit/check, /healthz, /readyz
  redis    $QUOTAFLOW_REDIS_URL   (data in $DEV_DIR/redis)
  rules    $QUOTAFLOW_RULES

Try:
  curl -s -H 'Content-Type: application/json' http://$LISTEN/quotaflow.v1.RateLimiter/CheckRateLimit \\
    -d '{"identifier":"alice","dimension":"DIMENSION_USER","endpoint":"/api/v1/orders"}'
  ./bin/quotaflow check --user alice --endpoint /api/v1/orders

MSG
wait -n "${pids[@]}"
