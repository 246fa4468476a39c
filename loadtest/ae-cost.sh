#!/usr/bin/env bash
# What anti-entropy costs per record it moves (issue 21, point 5): a
# 3-node cluster (ack=2, from=3 for a first fill), then RECORDS keys
# written to one replica each (ack=1, from=1), so that every such key
# lacks two copies; then POST /repair on every node at once, and the
# servers' CPU (/proc/PID/stat, summed over the three) divided by the
# records the exchanges moved. No other load runs. PROFILE=NAME also takes
# a 15 s CPU profile of each node into NAME-<i>.pprof. DHTKV: the server
# binary (default: built from this repository), to compare two builds.
# Only 127.0.0.1 is contacted.
#
#   loadtest/ae-cost.sh
#   DHTKV=/tmp/dhtkv-before loadtest/ae-cost.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RECORDS=${RECORDS:-150000}
PORT=${PORT:-18780}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
if [ -n "${DHTKV:-}" ]; then cp "$DHTKV" "$tmp/dhtkv"; else (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); fi
ports=("$((PORT + 1))" "$((PORT + 2))" "$((PORT + 3))")
cluster=$(printf 'http://127.0.0.1:%s,' "${ports[@]}")
cluster=${cluster%,}
for p in "${ports[@]}"; do
  "$tmp/dhtkv" --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$((p + 10))" --data-dir "$tmp/n$p" \
    --cluster "$cluster" --ae-interval 0 ${NODE_FLAGS:-} >"$tmp/n$p.log" 2>&1 &
  pids+=($!)
done
for p in "${ports[@]}"; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$((p + 10))/readyz" && break; sleep 0.1; done
done
"$tmp/dhtkv-load" --targets "$cluster" --ack 2 --from 3 --workload put --fill 100000 --fill-only 2>/dev/null
"$tmp/dhtkv-load" --targets "$cluster" --ack 1 --from 1 --workload put --fill "$RECORDS" --fill-only 2>/dev/null
source "$ROOT/loadtest/settle.sh"
settle "${ports[@]}"
ticks() { local t=0 p; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
if [ -n "${PROFILE:-}" ]; then
  for i in 1 2 3; do curl -s -o "$PROFILE-$i.pprof" "http://127.0.0.1:$((ports[i - 1] + 10))/debug/pprof/profile?seconds=15" & done
fi
t0=$(ticks); s0=$(date +%s.%N)
cp=()
for i in 1 2 3; do curl -s -X POST "http://127.0.0.1:$((ports[i - 1] + 10))/repair" >"$tmp/r$i.json" & cp+=($!); done
for p in "${cp[@]}"; do wait "$p"; done
t1=$(ticks); s1=$(date +%s.%N)
recs=$(cat "$tmp"/r*.json | jq -s '[.[][] | .pulled + .pushed] | add')
failed=$(cat "$tmp"/r*.json | jq -s '[.[][] | .failed] | add')
echo "load $(cut -d' ' -f1 /proc/loadavg): $recs records moved ($failed failed) for $((2 * RECORDS)) missing copies in $(echo "$s1 - $s0" | bc) s; server CPU $(((t1 - t0) * 10)) ms, $(((t1 - t0) * 10000 / recs)) µs per record"
