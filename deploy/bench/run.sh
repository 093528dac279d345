#!/usr/bin/env bash
# Reproduces the end-to-end figures of docs/performance.md on this machine, side by side in one
# run: a Redis and a checker of their own, then
#   1. the Redis ceiling: redis-benchmark pipelining a minimal token-bucket script (the cost of
#      one bucket check in Redis, without quotaflow);
#   2. quotaflow bench, closed loop, for the maximum checks/s, with the CPU the generator, the
#      checker and Redis spent per check (bash's time, /proc/<pid>/stat);
#   3. quotaflow bench, open loop at half that rate and at lower rates, for the latency
#      percentiles;
#   4. three limits per check, and the other protocols.
# Usage: deploy/bench/run.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS="${1:-10}"
PORT_REDIS=6395
LISTEN=127.0.0.1:8095
make -s build
# shellcheck source=deploy/bench/lib.sh
. deploy/bench/lib.sh

./bin/quotaflow checker --listen "$LISTEN" --redis-url "redis://127.0.0.1:$PORT_REDIS/0" \
  --rules deploy/bench/rules.yaml --log-level warn &
srv=$!
ready "http://$LISTEN/readyz"

echo "== 1. Redis ceiling: redis-benchmark, minimal token-bucket Lua, 16 pipelined, 50 clients"
tb='local t=redis.call("TIME") local now=t[1]*1000000+t[2] local v=redis.call("HMGET",KEYS[1],"tk","ts") local tk=tonumber(v[1]) or 100 local ts=tonumber(v[2]) or now tk=math.min(100,tk+(now-ts)*100/1000000) if tk>=1 then tk=tk-1 end redis.call("HSET",KEYS[1],"tk",tk,"ts",now) redis.call("PEXPIRE",KEYS[1],1000) return 1'
sha=$(redis-cli -p "$PORT_REDIS" script load "$tb")
redis-benchmark -p "$PORT_REDIS" -n $((SECS * 100000)) -c 50 -P 16 -r 10000 -q evalsha "$sha" 1 'rl:{user:__rand_int__}:tb' | tr '\r' '\n' | tail -1

run() { # label, extra bench flags...
  local label=$1; shift
  local c0 r0 c1 r1 gen
  c0=$(ticks "$srv"); r0=$(ticks "$redis_pid")
  gen=$( { TIMEFORMAT='%U %S'; time ./bin/quotaflow bench --target "http://$LISTEN" --duration "${SECS}s" --json "$@" >"$dir/out" 2>/dev/null; } 2>&1 )
  c1=$(ticks "$srv"); r1=$(ticks "$redis_pid")
  awk -v label="$label" -v n="$(field checks)" -v cps="$(field checks_per_sec)" -v p50="$(field p50_ms)" \
    -v p99="$(field p99_ms)" -v p999="$(field p999_ms)" -v errs="$(field errors)" \
    -v cc=$((c1 - c0)) -v rc=$((r1 - r0)) -v hz="$hz" -v gen="$gen" 'BEGIN {
    split(gen, g, " ")
    printf "%-36s %7.0f checks/s  p50 %6.3f  p99 %6.3f  p99.9 %6.3f ms  CPU us/check: generator %5.1f  checker %5.1f  redis %5.1f  errors %s\n",
      label, cps, p50, p99, p999, (g[1] + g[2]) * 1e6 / n, cc * 1e6 / hz / n, rc * 1e6 / hz / n, errs }'
  field checks_per_sec > "$dir/last_rate"
}

echo "== 2. closed loop, 64 workers, 1 limit, 10k uniform keys: Envoy RLS (the peer's protocol) and gRPC"
run "rls, closed loop" --protocol rls --concurrency 64 --endpoint /one --keys 10000
half=$(awk '{printf "%d", $1 / 2}' "$dir/last_rate")
run "grpc, closed loop" --protocol grpc --concurrency 64 --endpoint /one --keys 10000
echo "== 3. open loop (latency from each check's due time), rls, 1 limit"
run "rls, open loop at half ($half/s)" --protocol rls --rate "$half" --concurrency 256 --endpoint /one --keys 10000
for rate in 5000 2000 1000; do
  run "rls, open loop at $rate/s" --protocol rls --rate "$rate" --concurrency 256 --endpoint /one --keys 10000
done
echo "== 4. three limits per check, Connect over HTTP/1.1"
run "rls, 3 limits, closed loop" --protocol rls --concurrency 64 --endpoint /three --keys 10000
run "connect, closed loop" --protocol connect --concurrency 64 --endpoint /one --keys 10000
