#!/usr/bin/env bash
# Measures a 3-node cluster (ack=2, from=3, load spread over the three
# nodes) against a single node in ONE run, alternating closed-loop runs of
# bin/dhtkv-load for several rounds, and prints median rps, p50 and p99.
# Both use the default --sync=true. Only 127.0.0.1 is contacted.
#
# PUTs and GETs go to separate systems (a node and a cluster for each), all
# filled with the whole keyspace first: a PUT run would otherwise
# invalidate the read caches just before the GET run, and a cluster node,
# which sees a third of the reads a single node sees, would then measure a
# colder cache than the node. The GET systems get one unmeasured warm-up
# run each; the script prints their read caches' hit ratios. After every
# PUT run the script waits (up to 60 s) until that system's Pebble has run
# no flush or compaction for a second, so that no run pays for the
# previous run's background work on the shared two cores.
#
#   loadtest/cluster-vs-node.sh                  # defaults below
#   ROUNDS=5 DURATION=15s loadtest/cluster-vs-node.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
SYNC=${SYNC:-true}

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)

# The PUT systems on 1818x, the GET systems on 1828x; admin ports +10.
node_put=http://127.0.0.1:18180
cluster_put=http://127.0.0.1:18181,http://127.0.0.1:18182,http://127.0.0.1:18183
node_get=http://127.0.0.1:18280
cluster_get=http://127.0.0.1:18281,http://127.0.0.1:18282,http://127.0.0.1:18283
start() { # name port cluster
  "$tmp/dhtkv" --listen "127.0.0.1:$2" --admin-listen "127.0.0.1:$(($2 + 10))" --data-dir "$tmp/$1" \
    ${3:+--cluster "$3"} --sync="$SYNC" >"$tmp/$1.log" 2>&1 & pids+=($!)
}
start node-put 18180
start node-get 18280
for i in 1 2 3; do
  start "cluster-put-$i" "1818$i" "$cluster_put"
  start "cluster-get-$i" "1828$i" "$cluster_get"
done
for port in 18180 18181 18182 18183 18280 18281 18282 18283; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/v0/status" && break; sleep 0.1; done
done

load() { # targets workload [ack from] [fill]
  "$tmp/dhtkv-load" --json --targets "$1" --workload "$2" --ack "${3:-0}" --from "${4:-0}" \
    --keyspace "$KEYSPACE" --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" \
    --duration "$DURATION" --fill "${5:-0}" 2>/dev/null
}
source "$ROOT/loadtest/settle.sh"
# Fill all four with the whole keyspace (the GETs then all find their key),
# then warm the GET systems' read caches.
load "$node_put" put 0 0 "$KEYSPACE" >/dev/null
load "$cluster_put" put 2 3 "$KEYSPACE" >/dev/null
load "$node_get" put 0 0 "$KEYSPACE" >/dev/null
load "$cluster_get" put 2 3 "$KEYSPACE" >/dev/null
settle 18180 18181 18182 18183 18280 18281 18282 18283
load "$node_get" get >/dev/null
load "$cluster_get" get 2 3 >/dev/null
cachestat() { # port... -> "hits misses" summed
  for port in "$@"; do curl -s "http://127.0.0.1:$((port + 10))/metrics"; done |
    awk '$1 == "dhtkv_cache_hits_total" {h += $2} $1 == "dhtkv_cache_misses_total" {m += $2} END {printf "%d %d", h, m}'
}
node_cache0=$(cachestat 18280) cluster_cache0=$(cachestat 18281 18282 18283)

source "$ROOT/loadtest/runs.sh"
echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), --sync=$SYNC, $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, values $VALUE_SIZE B"
for r in $(seq "$ROUNDS"); do
  record node-put "$(load "$node_put" put)"
  settle 18180
  record cluster-put "$(load "$cluster_put" put 2 3)"
  settle 18181 18182 18183
  record node-get "$(load "$node_get" get)"
  record cluster-get "$(load "$cluster_get" get 2 3)"
done
hitratio() { # before after -> percent of lookups that hit (a miss is counted twice: Get, then Fill's re-check)
  awk -v a="$1" -v b="$2" 'BEGIN {split(a, x, " "); split(b, y, " "); h = y[1] - x[1]; m = (y[2] - x[2]) / 2; printf "%.0f%% of %d", 100 * h / (h + m), h + m}'
}
echo
echo "read cache hits during the measured GET runs: node $(hitratio "$node_cache0" "$(cachestat 18280)") lookups, cluster $(hitratio "$cluster_cache0" "$(cachestat 18281 18282 18283)") lookups"
table node node-put cluster-put node-get cluster-get
