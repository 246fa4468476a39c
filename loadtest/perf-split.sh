#!/usr/bin/env bash
# Where a request's server CPU goes, one node against a 3-node cluster
# (ack=2, from=3), closed loop, each read cache holding every key: a
# `perf record -g` of the server processes during each run, split into
# the kernel's share, the Go scheduler's (runtime.schedule: finding work,
# parking and waking threads), sysmon's, and the request path's parts,
# each in µs of CPU per client request. Sampling costs CPU of its own, so
# compare the node's and the cluster's figures of one run, not with
# syscalls.sh's. Needs perf (run as root). Only 127.0.0.1 is contacted.
#
#   loadtest/perf-split.sh                     # GET
#   WORKLOAD=put DURATION=20 loadtest/perf-split.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORKLOAD=${WORKLOAD:-get}
DURATION=${DURATION:-15}
command -v perf >/dev/null || { echo "perf not found" >&2; exit 1; }
source "$ROOT/loadtest/node-and-cluster.sh"
sleep 2

# share DATA SYMBOL: the percentage of the samples with SYMBOL on their stack.
share() {
  perf report -i "$1" --stdio --children --sort sym -g none --percent-limit 0 2>/dev/null |
    awk -v s="$2" '$NF == s { sub("%", "", $1); print $1; found = 1; exit } END { if (!found) print 0 }'
}
freq=1999
run() { # label pids targets ack from
  local out req data="$tmp/$1.data" cpu kernel
  perf record -F $freq -g -o "$data" -p "$2" -- sleep "$DURATION" >/dev/null 2>&1 &
  out=$(load "$3" "$WORKLOAD" "$4" "$5" --duration "${DURATION}s" --json)
  wait $!
  req=$(jq .requests <<<"$out")
  cpu=$(perf report -i "$data" --stdio -n --no-children -g none --sort dso 2>/dev/null | awk '/^ +[0-9.]+%/ { n += $2 } END { print n }')
  kernel=$(perf report -i "$data" --stdio --no-children -g none --sort dso 2>/dev/null | awk '$2 == "[kernel.kallsyms]" { sub("%", "", $1); print $1 }')
  echo "$1: $(jq '.throughput_rps | floor' <<<"$out") rps; per request, µs of CPU (samples at $freq Hz):"
  awk -v c="$cpu" -v f=$freq -v r="$req" -v k="${kernel:-0}" 'BEGIN {
    t = c / f * 1e6 / r; printf "  %-44s %6.1f\n  %-44s %6.1f\n", "all", t, "in the kernel", t * k / 100 }'
  local sym
  for sym in runtime.schedule runtime.sysmon 'github.com/valyala/fasthttp.(*Server).serveConnCounted' \
    'github.com/dhtkv/dhtkv/internal/httpapi.(*Server).entity' 'github.com/dhtkv/dhtkv/internal/cluster.(*Coordinator).fanOut' \
    'github.com/dhtkv/dhtkv/internal/httpapi.(*Server).internal' 'github.com/dhtkv/dhtkv/internal/rpc.(*Peer).sender' \
    'github.com/dhtkv/dhtkv/internal/store.(*Store).write' runtime.gcBgMarkWorker; do
    awk -v c="$cpu" -v f=$freq -v r="$req" -v p="$(share "$data" "$sym")" -v s="$sym" 'BEGIN {
      sub("github.com/dhtkv/dhtkv/", "", s); sub("github.com/[^/]*/", "", s); printf "  %-44s %6.1f\n", s, c / f * 1e6 / r * p / 100 }'
  done
}
echo "# $(nproc) cores, $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg), server $DHTKV $NODE_FLAGS, $WORKLOAD, ${DURATION}s runs"
run "node $WORKLOAD" "$npid" $node 0 0
cl=$(IFS=,; echo "${cpids[*]}")
run "cluster $WORKLOAD ack=2 from=3" "$cl" "$cluster" 2 3
