#!/usr/bin/env bash
# System calls, context switches and server CPU per request (perf stat over
# the server processes) of one node and of a 3-node cluster (ack=2,
# from=3; ack=1 too for GET, which reads the local replica only), closed
# loop, each read cache holding every key (read first with --read-all).
# Counts move much less than times when the machine is shared, so they
# show what a change on the request path saves even on a busy box. Needs
# perf with the syscalls tracepoints (run as root). Only 127.0.0.1 is
# contacted.
#
#   loadtest/syscalls.sh                       # GET
#   WORKLOAD=put DHTKV=/tmp/old/dhtkv loadtest/syscalls.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORKLOAD=${WORKLOAD:-get}
DURATION=${DURATION:-8}
command -v perf >/dev/null || { echo "perf not found" >&2; exit 1; }
source "$ROOT/loadtest/node-and-cluster.sh"
ticks() { local t=0 p; for p in ${1//,/ }; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
hz=$(getconf CLK_TCK)
events=raw_syscalls:sys_enter,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_fdatasync,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_futex,syscalls:sys_enter_nanosleep,context-switches
run() { # label pids targets ack from
  local t0 t1 out req
  t0=$(ticks "$2")
  perf stat -x, -e "$events" -p "$2" -o "$tmp/perf.txt" -- sleep "$DURATION" &
  out=$(load "$3" "$WORKLOAD" "$4" "$5" --duration "${DURATION}s" --json)
  wait $!
  t1=$(ticks "$2")
  req=$(jq .requests <<<"$out")
  echo "$1: $(jq '.throughput_rps | floor' <<<"$out") rps, $(((t1 - t0) * 1000000 / hz / req)) µs server CPU per request"
  awk -F, -v r="$req" '/^[0-9]/ { printf "  %-32s %6.2f per request\n", $3, $1 / r }' "$tmp/perf.txt"
}
echo "# $(nproc) cores, $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg), server $DHTKV $NODE_FLAGS, $WORKLOAD, ${DURATION}s runs"
run "node $WORKLOAD" "$npid" $node 0 0
cl=$(IFS=,; echo "${cpids[*]}")
run "cluster $WORKLOAD ack=2 from=3" "$cl" "$cluster" 2 3
if [ "$WORKLOAD" = get ]; then run "cluster get ack=1 from=3" "$cl" "$cluster" 1 3; fi
