#!/usr/bin/env bash
# CPU time per request of one dhtkv node and of the in-memory baseline
# server (cmd/dhtkv-baseline, labelled "ceiling") under the same wrk load,
# alternating, in ONE run. CPU is the server process's user+system ticks
# (/proc/<pid>/stat) over a wrk run divided by the requests it answered: a
# steadier figure than rps on this shared 2-core machine, where wrk and the
# server share the cores.
#
#   loadtest/wrk/cpu-per-request.sh get.lua                  # node defaults
#   loadtest/wrk/cpu-per-request.sh put.lua --sync=false     # extra node flags
#
# The node gets a read cache that holds every key; a warm-up run precedes
# the measured ones. Builds what it runs from this repository. Only
# 127.0.0.1 is contacted. Needs wrk.
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-2}
script=${1:?usage: cpu-per-request.sh get.lua|put.lua [dhtkv flags...]}
shift
source "$(dirname "$0")/setup.sh"

"$tmp/dhtkv-baseline" --listen 127.0.0.1:18380 >"$tmp/baseline.log" 2>&1 & pids+=($!); ceiling_pid=$!
"$tmp/dhtkv" --listen 127.0.0.1:18381 --data-dir "$tmp/node" --cache-bytes $cache "$@" >"$tmp/node.log" 2>&1 & pids+=($!); node_pid=$!
wait_up 18380 18381
prefill 18380 18381
wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/$script" http://127.0.0.1:18381 >/dev/null # warm-up

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
echo "# $(nproc) cores, $(date -u +%FT%TZ), $script, $CONNECTIONS connections, $DURATION per run, node flags: ${*:-none}"
for r in $(seq "$ROUNDS"); do
  for target in "ceiling $ceiling_pid 18380" "dhtkv $node_pid 18381"; do
    set -- $target
    t0=$(ticks "$2")
    line=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/$script" "http://127.0.0.1:$3" | grep '^WRKRESULT')
    t1=$(ticks "$2")
    n=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$line")
    rps=$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$line")
    awk -v who="$1" -v r="$r" -v rps="$rps" -v n="$n" -v d="$((t1 - t0))" -v hz="$hz" \
      'BEGIN { printf "round %d %-8s rps %9.0f  cpu %6.2f us/request\n", r, who, rps, d * 1e6 / hz / n }'
  done
done
