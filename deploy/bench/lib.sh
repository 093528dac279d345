# What the end-to-end bench scripts (run.sh, compare.sh, peers.sh) share; each sources it from
# the repository's root after setting PORT_REDIS.
#   - dir: a scratch folder, removed on exit;
#   - a Redis of its own on PORT_REDIS (no persistence), stopped on exit, its pid in redis_pid;
#   - srv: the pid of the server under test, if any, stopped on exit (stop_server stops it
#     before);
#   - ticks PID: the CPU ticks (user + system) a process has spent, hz of them a second;
#   - ready URL: waits up to 10 s for URL to answer, else ends the script;
#   - field NAME: a number of the JSON report in $dir/out (quotaflow bench --json).
dir=$(mktemp -d)
srv=
stop_server() {
  if [ -n "$srv" ]; then
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
  fi
  srv=
}
cleanup() {
  stop_server
  redis-cli -p "$PORT_REDIS" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
redis-server --port "$PORT_REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes --logfile "$dir/redis.log"
for _ in $(seq 50); do redis-cli -p "$PORT_REDIS" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_pid=$(redis-cli -p "$PORT_REDIS" info server | sed -n 's/^process_id:\([0-9]*\).*/\1/p')
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
ready() {
  for _ in $(seq 100); do curl -fs "$1" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "not ready: $1" >&2
  exit 1
}
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" "$dir/out"; }
