#!/usr/bin/env bash
# Installs the servers quotaflow's dev environment and tests need, from Debian's packages, when
# they are missing. Safe to run again: it does nothing when everything is there.
set -euo pipefail

if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: Go is not installed; install Go $(sed -n 's/^go //p' "$(dirname "$0")/../../go.mod") or newer" >&2
  exit 1
fi

# grpcurl, for the walkthroughs (the README's tour, docs/api.md) and the test that calls the checker with it (TestRLSGrpcurl).
gobin="$(go env GOPATH)/bin"
if ! command -v grpcurl >/dev/null 2>&1 && [ ! -x "$gobin/grpcurl" ]; then
  echo "install-deps: installing grpcurl into $gobin (go install)"
  go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4
fi

# envoyproxy/ratelimit, the reference service the differential test compares with
# (TestEnvoyReferenceAgreement): its binary, and its example configuration in the module cache.
# The version is the test's envoyRatelimitVersion.
ratelimit_version=v1.4.1-0.20260122083618-3fb702589d36
if [ ! -x "$gobin/service_cmd" ] || [ ! -d "$(go env GOMODCACHE)/github.com/envoyproxy/ratelimit@$ratelimit_version/examples" ]; then
  echo "install-deps: installing envoyproxy/ratelimit $ratelimit_version into $gobin (go install)"
  go install "github.com/envoyproxy/ratelimit/src/service_cmd@$ratelimit_version"
fi

missing=()
# redis-server also runs the Sentinel tests in its sentinel mode (redis-server --sentinel), so no
# redis-sentinel binary is needed; --redis-sentinel is only the checker's flag naming the sentinels.
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# Debian puts clickhouse-server in /usr/sbin, which a user's PATH may lack.
[ -x /usr/sbin/clickhouse-server ] || command -v clickhouse-server >/dev/null 2>&1 || missing+=(clickhouse-server)
command -v clickhouse-client >/dev/null 2>&1 || missing+=(clickhouse-client)
# ZooKeeper for the replicated ClickHouse tests: internal/testbed/zookeepertest runs its jar with Java
# (which the package pulls in) on ports of its own. The package has no command on PATH and
# starts no service (that is zookeeperd, which is not needed).
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
# `docker-compose config` validates docker-compose.yml in the tests; no Docker engine is needed.
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
# The gateways that the forward-auth tests (TestGateway*) run in front of a checker: nginx
# (auth_request), Caddy (forward_auth) and HAProxy (Lua core.httpclient). Debian puts nginx and
# haproxy in /usr/sbin. nginx-light is the smallest nginx with auth_request.
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v caddy >/dev/null 2>&1 || missing+=(caddy)
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
# promtool, which Debian ships in the prometheus package (/usr/bin/promtool): the tests check
# and unit-test the alert rules (deploy/prometheus) and parse the dashboards' PromQL
# (deploy/grafana) with it. The tests run no Prometheus server.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)

# Debian's Chromium, which the web console's test drives headless (TestConsole, with chromedp).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged service where systemd runs; quotaflow runs its own on other ports.
