#!/usr/bin/env bash
# Runs envoyproxy/ratelimit, gubernator and quotaflow checkers in turn under the same client, so
# that docs/performance.md's side by side (issue 22, item 9) comes from one run on this shared
# machine. The peers are built from their public modules by `go install` into a scratch folder
# outside the repository (their code is never part of quotaflow's), pinned so that runs of
# different days build the same code.
#
# Every server gets the same load: quotaflow bench's closed loop (64 workers, 10k users, one
# limit far above the load, on ENDPOINT) for SECS seconds after 1 s of warm-up.
#   - envoyproxy/ratelimit on one Redis, over Envoy RLS: a config of user_id then path ENDPOINT,
#     a fixed window of 1e9 per second (its only algorithm), as deploy/bench/rules.yaml's
#     /fixed is;
#   - gubernator, one node, in memory (no Redis), over its own gRPC API: a token bucket of 1e9
#     per second per user;
#   - each quotaflow checker on the same Redis, over Envoy RLS, with deploy/bench/rules.yaml:
#     on /fixed the same fixed window as the peer's, on /one a token bucket.
# For each it prints checks/s, p99, the server's and Redis's CPU per check (/proc/<pid>/stat).
#
# Usage: deploy/bench/peers.sh label=/path/to/quotaflow [label=/path/to/quotaflow ...]
# Environment: PEERS_DIR (the scratch folder, default $TMPDIR/quotaflow-peers), ENVOY_VERSION and
# GUBERNATOR_VERSION (module versions), ENDPOINT (default /fixed), SECS (default 10), ROUNDS
# (default 2), CLIENT (the quotaflow binary that sends the load, default the first checker's).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 label=/path/to/quotaflow ..." >&2; exit 2; }
PEERS_DIR="${PEERS_DIR:-${TMPDIR:-/tmp}/quotaflow-peers}"
ENVOY_VERSION="${ENVOY_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}"
GUBERNATOR_VERSION="${GUBERNATOR_VERSION:-v2.13.0}"
ENDPOINT="${ENDPOINT:-/fixed}"
SECS="${SECS:-10}"
ROUNDS="${ROUNDS:-2}"
first="${1#*=}"
CLIENT="${CLIENT:-$first}"
case "$(realpath -m "$PEERS_DIR")/" in
"$(pwd)"/*) echo "PEERS_DIR must be outside the repository: the peers' code is never committed" >&2; exit 2 ;;
esac

# The peers, built once per version (a version of its own names each binary).
envoy="$PEERS_DIR/bin/ratelimit-$ENVOY_VERSION"
gubernator="$PEERS_DIR/bin/gubernator-$GUBERNATOR_VERSION"
build_peer() { # module path, version, binary
  [ -x "$3" ] && return
  echo "building $1@$2 into $PEERS_DIR" >&2
  mkdir -p "$PEERS_DIR/gobin"
  (cd "$PEERS_DIR" && GOBIN="$PEERS_DIR/gobin" GOFLAGS= go install "$1@$2")
  mv "$PEERS_DIR/gobin/$(basename "$1")" "$3"
}
mkdir -p "$PEERS_DIR/bin"
build_peer github.com/envoyproxy/ratelimit/src/service_cmd "$ENVOY_VERSION" "$envoy"
build_peer github.com/gubernator-io/gubernator/v2/cmd/gubernator "$GUBERNATOR_VERSION" "$gubernator"
mkdir -p "$PEERS_DIR/runtime/ratelimit/config"
cat >"$PEERS_DIR/runtime/ratelimit/config/config.yaml" <<EOF
domain: quotaflow
descriptors:
  - key: user_id
    descriptors:
      - key: path
        value: $ENDPOINT
        rate_limit: {unit: second, requests_per_unit: 1000000000}
EOF

PORT_REDIS=6394
# shellcheck source=deploy/bench/lib.sh
. deploy/bench/lib.sh

# measure label target protocol: the load against the server running as $srv.
measure() {
  "$CLIENT" bench --target "$2" --endpoint "$ENDPOINT" --protocol "$3" --duration 1s >/dev/null 2>&1 # warm-up
  local s0 r0 s1 r1
  s0=$(ticks "$srv"); r0=$(ticks "$redis_pid")
  "$CLIENT" bench --target "$2" --endpoint "$ENDPOINT" --protocol "$3" --duration "${SECS}s" --json >"$dir/out" 2>/dev/null
  s1=$(ticks "$srv"); r1=$(ticks "$redis_pid")
  awk -v round="$round" -v label="$1" -v n="$(field checks)" -v cps="$(field checks_per_sec)" -v p99="$(field p99_ms)" \
    -v errs="$(field errors)" -v sc=$((s1 - s0)) -v rc=$((r1 - r0)) -v hz="$hz" 'BEGIN {
    printf "%d %-26s %8.0f checks/s  p99 %6.2f ms  server %6.1f µs  redis %5.1f µs  errors %s\n",
      round, label, cps, p99, sc * 1e6 / hz / n, rc * 1e6 / hz / n, errs }'
  stop_server
}

for round in $(seq "$ROUNDS"); do
  REDIS_URL=127.0.0.1:$PORT_REDIS REDIS_SOCKET_TYPE=tcp USE_STATSD=false LOG_LEVEL=error \
    RUNTIME_ROOT="$PEERS_DIR/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    PORT=8185 GRPC_PORT=8186 DEBUG_PORT=8187 "$envoy" >"$dir/envoy.log" 2>&1 &
  srv=$!
  ready http://127.0.0.1:8185/healthcheck
  measure envoyproxy/ratelimit http://127.0.0.1:8186 rls

  GUBER_GRPC_ADDRESS=127.0.0.1:8189 GUBER_HTTP_ADDRESS=127.0.0.1:8188 GUBER_LOG_LEVEL=error \
    "$gubernator" >"$dir/gubernator.log" 2>&1 &
  srv=$!
  ready http://127.0.0.1:8188/v1/HealthCheck
  measure gubernator http://127.0.0.1:8189 gubernator

  for spec in "$@"; do
    "${spec#*=}" checker --listen 127.0.0.1:8190 --redis-url "redis://127.0.0.1:$PORT_REDIS/0" \
      --rules deploy/bench/rules.yaml --log-level error >/dev/null 2>&1 &
    srv=$!
    ready http://127.0.0.1:8190/readyz
    measure "quotaflow ${spec%%=*}" http://127.0.0.1:8190 rls
  done
done
