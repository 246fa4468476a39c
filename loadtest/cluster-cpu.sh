#!/usr/bin/env bash
# Server CPU per request of a 3-node cluster (ack=2, from=3, --sync=true,
# load spread over the nodes) and of one node, closed loop, GET and PUT:
# user+system ticks of the servers (/proc/PID/stat, summed over the
# cluster's three processes) over a run, divided by the requests answered.
# Unlike rps, it does not depend on how much CPU the generator takes.
# DHTKV names the server binary to measure (default: built from this
# repository), so that two builds can be compared in one sitting.
# NODE_FLAGS are given to every server: by default a read cache that
# holds every key (--cache-bytes 512MiB for the 100k keys of 1 KiB), as
# in the highload issue's tables, filled by reading every key on every
# replica before each GET run; NODE_FLAGS= measures the default 64 MiB
# cache, where most GETs miss and a quorum read pays two Pebble lookups.
# Only 127.0.0.1 is contacted.
#
#   loadtest/cluster-cpu.sh
#   DHTKV=/tmp/old/dhtkv ROUNDS=3 loadtest/cluster-cpu.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
CONNECTIONS=${CONNECTIONS:-64}
KEYSPACE=${KEYSPACE:-100000}
NODE_FLAGS=${NODE_FLAGS---cache-bytes 512MiB}

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
if [ -z "${DHTKV:-}" ]; then (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); DHTKV=$tmp/dhtkv; fi

cluster=http://127.0.0.1:18481,http://127.0.0.1:18482,http://127.0.0.1:18483
declare -A pid
start() { # name port [cluster]
  # shellcheck disable=SC2086 # NODE_FLAGS is a list of flags
  "$DHTKV" --listen "127.0.0.1:$2" --data-dir "$tmp/$1" ${3:+--cluster "$3"} $NODE_FLAGS >"$tmp/$1.log" 2>&1 & pids+=($!); pid[$1]=$!
}
start node 18480
for i in 1 2 3; do start "c$i" "1848$i" "$cluster"; done
for p in 18480 18481 18482 18483; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$p/v0/status" && break; sleep 0.1; done
done
load() { # targets workload ack from [extra]
  "$tmp/dhtkv-load" --json --targets "$1" --workload "$2" --ack "$3" --from "$4" --keyspace "$KEYSPACE" \
    --connections "$CONNECTIONS" --duration "$DURATION" "${@:5}" 2>/dev/null
}
load http://127.0.0.1:18480 put 0 0 --fill "$KEYSPACE" >/dev/null
load "$cluster" put 2 3 --fill "$KEYSPACE" >/dev/null
# A write invalidates its key's cache entry, so only reads fill the cache,
# and a random GET run fills it slowly (after as many reads as keys, about
# 63% of them are cached; a cluster's misses, which read Pebble, were
# charged to its quorum reads, and a PUT run just before empties much of
# it): before each GET run, every key is read once on every replica
# (--read-all, ack=from=3 on the cluster).
warm() { # targets ack from
  load "$1" get "$2" "$3" --read-all "$KEYSPACE" --fill-only >/dev/null
}
ticks() { local t=0; for n in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/${pid[$n]}/stat"))); done; echo $t; }
hz=$(getconf CLK_TCK)
# settle waits (at most 30 s) until every server is idle, below 3% of a
# core over a second: the flushes and compactions a run leaves behind are
# its own cost, not the next run's (a GET run right after the cluster's
# PUT run was charged for three nodes' compactions). A run after servers
# that never went idle is measured anyway, with a warning.
settle() {
  local t0 t1
  for _ in $(seq 30); do
    t0=$(ticks node c1 c2 c3)
    sleep 1
    t1=$(ticks node c1 c2 c3)
    (((t1 - t0) * 100 < 3 * hz)) && return
  done
  echo "# warning: the servers were still busy after 30 s" >&2
}
measure() { # label targets workload ack from nodes...
  local before after out
  settle
  before=$(ticks "${@:6}")
  out=$(load "$2" "$3" "$4" "$5")
  after=$(ticks "${@:6}")
  jq -r --arg l "$1" --argjson cpu "$(((after - before) * 1000000 / hz))" \
    '"\($l) \(.throughput_rps | floor) rps, \(.non_2xx + .errors.connect + .errors.timeout + .errors.other) failed, \($cpu / .requests * 10 | floor / 10) µs CPU per request"' <<<"$out"
}
echo "# $(nproc) cores, $(date -u +%FT%TZ), server $DHTKV ${NODE_FLAGS}, $CONNECTIONS connections, $DURATION per run, --sync=true"
for r in $(seq "$ROUNDS"); do
  measure node-put http://127.0.0.1:18480 put 0 0 node
  measure cluster-put "$cluster" put 2 3 c1 c2 c3
  warm http://127.0.0.1:18480 0 0
  measure node-get http://127.0.0.1:18480 get 0 0 node
  warm "$cluster" 3 3
  measure cluster-get "$cluster" get 2 3 c1 c2 c3
done
