#!/usr/bin/env bash
# Runs checkers of different builds in turn on one Redis under the same client, so that their
# figures come from one run on this shared machine (docs/performance.md compares binaries this
# way). For each load and each checker it prints checks/s, p99, the checker's and Redis's CPU per
# check (/proc/<pid>/stat), the script time per check (INFO commandstats, reset before each
# load) and the checks per script call.
# Usage: deploy/bench/compare.sh label=/path/to/quotaflow [label=/path/to/quotaflow ...]
# Environment: SECS (seconds per load, default 8), ROUNDS (default 2), CLIENT (the quotaflow
# binary that sends the load, default the first checker's), LOADS (quotaflow bench flags per
# load, separated by ";", default "--protocol rls;--protocol grpc --batch 64 --concurrency 4;
# --protocol rls --rate 1000").
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 label=/path/to/quotaflow ..." >&2; exit 2; }
SECS="${SECS:-8}"
ROUNDS="${ROUNDS:-2}"
first="${1#*=}"
CLIENT="${CLIENT:-$first}"
IFS=';' read -ra loads <<< "${LOADS:---protocol rls;--protocol grpc --batch 64 --concurrency 4;--protocol rls --rate 1000}"
PORT_REDIS=6396
LISTEN=127.0.0.1:8096
# shellcheck source=deploy/bench/lib.sh
. deploy/bench/lib.sh

for round in $(seq "$ROUNDS"); do
  for spec in "$@"; do
    label=${spec%%=*} bin=${spec#*=}
    "$bin" checker --listen "$LISTEN" --redis-url "redis://127.0.0.1:$PORT_REDIS/0" \
      --rules deploy/bench/rules.yaml --log-level error >/dev/null 2>&1 &
    srv=$!
    ready "http://$LISTEN/readyz"
    for load in "${loads[@]}"; do
      # shellcheck disable=SC2086 # a load is several flags
      "$CLIENT" bench --target "http://$LISTEN" --endpoint /one --duration 1s $load >/dev/null 2>&1 # warm-up
      redis-cli -p "$PORT_REDIS" config resetstat >/dev/null
      c0=$(ticks "$srv"); r0=$(ticks "$redis_pid")
      # shellcheck disable=SC2086
      "$CLIENT" bench --target "http://$LISTEN" --endpoint /one --duration "${SECS}s" --json $load >"$dir/out" 2>/dev/null
      c1=$(ticks "$srv"); r1=$(ticks "$redis_pid")
      script=$(redis-cli -p "$PORT_REDIS" info commandstats | tr -d '\r' |
        awk -F'[=,:]' '/^cmdstat_(evalsha|eval|fcall):/ {u += $5; c += $3} END {print u + 0, c + 0}')
      awk -v round="$round" -v label="$label" -v load="$load" -v n="$(field checks)" -v cps="$(field checks_per_sec)" \
        -v p99="$(field p99_ms)" -v errs="$(field errors)" -v cc=$((c1 - c0)) -v rc=$((r1 - r0)) -v hz="$hz" -v script="$script" 'BEGIN {
        split(script, s, " ")
        printf "%d %-10s %-42s %8.0f checks/s  p99 %6.2f ms  checker %6.1f µs  redis %5.1f µs  script %5.1f µs  %4.1f checks/call  errors %s\n",
          round, label, load, cps, p99, cc * 1e6 / hz / n, rc * 1e6 / hz / n, s[1] / n, (s[2] > 0 ? n / s[2] : 0), errs }'
    done
    stop_server
  done
done
