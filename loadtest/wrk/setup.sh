# Shared by the wrk comparison scripts (sourced, not run): settings with
# their environment overrides, the repository's dhtkv, dhtkv-baseline and
# dhtkv-load built into $tmp, process cleanup on exit, and helpers to wait
# for a server and to prefill it. Only 127.0.0.1 is contacted.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LUA=${LUA_DIR:-$ROOT/loadtest/wrk}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
export KEYSPACE VALUE_SIZE

command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk (or make bench-ensure-wrk)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

(cd "$ROOT" && for cmd in dhtkv dhtkv-baseline dhtkv-load; do go build -o "$tmp/$cmd" "./cmd/$cmd"; done)

# A read cache that holds the whole keyspace: GETs are cache hits.
cache=$(( KEYSPACE * (VALUE_SIZE + 128) * 2 ))

wait_up() { # port...
  local port
  for port in "$@"; do
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/v0/status" && break; sleep 0.1; done
  done
}

prefill() { # port... : writes k0..k<KEYSPACE-1> once each, the keys the Lua scripts read
  local port
  for port in "$@"; do
    "$tmp/dhtkv-load" --targets "http://127.0.0.1:$port" --fill "$KEYSPACE" --fill-only \
      --value-size "$VALUE_SIZE" --connections 32 2>"$tmp/prefill-$port.log" ||
      { echo "prefill of port $port failed:" >&2; cat "$tmp/prefill-$port.log" >&2; exit 1; }
  done
}
