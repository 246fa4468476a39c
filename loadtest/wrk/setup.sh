# Shared by the wrk comparison scripts (sourced, not run): settings with
# their environment overrides, the ceiling, prefill and dhtkv binaries built
# into $tmp, process cleanup on exit, and helpers to wait for and prefill a
# server. Only 127.0.0.1 is contacted.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CEILING_DIR=${CEILING_DIR:-$ROOT/../shared/tools/ceiling}
LUA=${LUA_DIR:-$ROOT/../shared/tools/lua}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
export KEYSPACE VALUE_SIZE

command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

(cd "$CEILING_DIR" && go build -o "$tmp/ceiling" . && go build -o "$tmp/prefill" ./prefill)
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv)

# A read cache that holds the whole keyspace: GETs are cache hits.
cache=$(( KEYSPACE * (VALUE_SIZE + 128) * 2 ))

wait_up() { # port...
  local port
  for port in "$@"; do
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/v0/entity?id=probe" && break; sleep 0.1; done
  done
}

prefill() { # port...
  local port
  for port in "$@"; do
    "$tmp/prefill" -url "http://127.0.0.1:$port" -n "$KEYSPACE" -size "$VALUE_SIZE" >/dev/null
  done
}
