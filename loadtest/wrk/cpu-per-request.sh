#!/usr/bin/env bash
# CPU time per request of one dhtkv node and of the in-memory ceiling under
# the same wrk load, alternating, in ONE run. CPU is the server process's
# user+system ticks (/proc/<pid>/stat) over a wrk run divided by the
# requests it answered: a steadier figure than rps on this shared 2-core
# machine, where wrk and the server share the cores.
#
#   loadtest/wrk/cpu-per-request.sh get.lua                  # node defaults
#   loadtest/wrk/cpu-per-request.sh put.lua --sync=false     # extra node flags
#
# The node gets a read cache that holds every key; a warm-up run precedes
# the measured ones. Only 127.0.0.1 is contacted. Needs wrk.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CEILING_DIR=${CEILING_DIR:-$ROOT/../shared/tools/ceiling}
LUA=${LUA_DIR:-$ROOT/../shared/tools/lua}
DURATION=${DURATION:-8s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-2}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
export KEYSPACE VALUE_SIZE
script=${1:?usage: cpu-per-request.sh get.lua|put.lua [dhtkv flags...]}
shift

command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$CEILING_DIR" && go build -o "$tmp/ceiling" . && go build -o "$tmp/prefill" ./prefill)
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv)

cache=$(( KEYSPACE * (VALUE_SIZE + 128) * 2 ))
"$tmp/ceiling" -addr 127.0.0.1:18380 >"$tmp/ceiling.log" 2>&1 & pids+=($!); ceiling_pid=$!
"$tmp/dhtkv" --listen 127.0.0.1:18381 --data-dir "$tmp/node" --cache-bytes $cache "$@" >"$tmp/node.log" 2>&1 & pids+=($!); node_pid=$!
for port in 18380 18381; do
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/v0/entity?id=probe" && break; sleep 0.1; done
  "$tmp/prefill" -url "http://127.0.0.1:$port" -n "$KEYSPACE" -size "$VALUE_SIZE" >/dev/null
done
wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/$script" http://127.0.0.1:18381 >/dev/null # warm-up

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
echo "# $(nproc) cores, $(date -u +%FT%TZ), $script, $CONNECTIONS connections, $DURATION per run, node flags: ${*:-none}"
for r in $(seq "$ROUNDS"); do
  for target in "ceiling $ceiling_pid 18380" "dhtkv $node_pid 18381"; do
    set -- $target
    t0=$(ticks "$2")
    line=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/$script" "http://127.0.0.1:$3" | grep '^WRKRESULT')
    t1=$(ticks "$2")
    n=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$line")
    rps=$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$line")
    awk -v who="$1" -v r="$r" -v rps="$rps" -v n="$n" -v d="$((t1 - t0))" -v hz="$hz" \
      'BEGIN { printf "round %d %-8s rps %9.0f  cpu %6.2f us/request\n", r, who, rps, d * 1e6 / hz / n }'
  done
done
