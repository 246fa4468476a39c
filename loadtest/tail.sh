#!/usr/bin/env bash
# The tail run (issue 21, point 3): a 3-node cluster (ack=2, from=3,
# --sync=true, load spread over the nodes) held at FRACTION (default half)
# of its own closed-loop rate for DURATION, latency measured from each
# request's intended send time (dhtkv-load --rate), second by second
# (--timeline). Beside each second it prints what the nodes' Pebble did in
# it (flushes, compactions, write stalls, summed over the nodes, sampled
# from /metrics once a second) and the servers' CPU per request answered
# in it (/proc, once a second), so that a spike can be matched with its
# cause. Only 127.0.0.1 is contacted.
#
#   loadtest/tail.sh                          # PUT, 60 s at half load
#   WORKLOAD=get DURATION=90s loadtest/tail.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORKLOAD=${WORKLOAD:-put}
DURATION=${DURATION:-60s}
FRACTION=${FRACTION:-0.5}
CONNECTIONS=${CONNECTIONS:-64}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
PORT=${PORT:-18380}
# NODE_FLAGS_1..3: extra dhtkv flags for one node each (experiments such as
# a different --memtable-bytes per node). NODE_ENV: environment settings
# for every node (e.g. NODE_ENV="GOMAXPROCS=1"). RATE: hold this rate
# instead of FRACTION of the closed-loop one, to compare two settings at
# the same load. DHTKV: the server binary (default: built from this
# repository), to compare two builds.

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
if [ -n "${DHTKV:-}" ]; then cp "$DHTKV" "$tmp/dhtkv"; else (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); fi

ports=("$((PORT + 1))" "$((PORT + 2))" "$((PORT + 3))")
cluster=$(printf 'http://127.0.0.1:%s,' "${ports[@]}")
cluster=${cluster%,}
for i in 1 2 3; do
  p=${ports[$((i - 1))]}
  extra=NODE_FLAGS_$i
  # shellcheck disable=SC2086 # the extra flags are words
  env ${NODE_ENV:-} "$tmp/dhtkv" --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$((p + 10))" --data-dir "$tmp/n$p" \
    --cluster "$cluster" ${!extra:-} >"$tmp/n$p.log" 2>&1 & pids+=($!)
done
for p in "${ports[@]}"; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$p/v0/status" && break; sleep 0.1; done
done
load() { # extra dhtkv-load flags...
  "$tmp/dhtkv-load" --json --targets "$cluster" --workload "$WORKLOAD" --ack 2 --from 3 \
    --keyspace "$KEYSPACE" --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" "$@" 2>/dev/null
}
source "$ROOT/loadtest/settle.sh"
load --workload put --duration 1s --fill "$KEYSPACE" >/dev/null
settle "${ports[@]}"
closed=$(load --duration 10s | jq -r .throughput_rps)
settle "${ports[@]}"
rate=${RATE:-$(awk -v r="$closed" -v f="$FRACTION" 'BEGIN {printf "%d", r * f}')}

pebble_now() { # -> "flushes compactions stalls" summed over the nodes
  for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$((p + 10))/metrics"; done |
    awk '$1 == "dhtkv_pebble_flushes_total" {f += $2} $1 == "dhtkv_pebble_compactions_total" {c += $2}
         $1 == "dhtkv_pebble_write_stalls_total" {s += $2} END {printf "%d %d %d", f, c, s}'
}
ticks() { local t=0 p; for p in "${pids[@]}"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo $t; }
# One sample a second from the run's start: the run's second i is between
# samples i and i+1.
( while :; do echo "$(date +%s.%N) $(pebble_now) $(ticks)"; sleep 1; done ) >"$tmp/pebble" & sampler=$!
t0=$(ticks) start=$(date +%s.%N)
out=$(load --rate "$rate" --duration "$DURATION" --timeline)
t1=$(ticks)
kill "$sampler" 2>/dev/null || true

echo "# node env [${NODE_ENV:-}], node flags: 1 [${NODE_FLAGS_1:-}] 2 [${NODE_FLAGS_2:-}] 3 [${NODE_FLAGS_3:-}]; memtables: $(for p in "${ports[@]}"; do grep -o 'memtable_bytes=[0-9]*' "$tmp/n$p.log" | head -1 | cut -d= -f2; done | tr '\n' ' ')"
echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), $WORKLOAD, closed loop $closed rps, held at $rate rps ($FRACTION) for $DURATION, $CONNECTIONS connections, keyspace $KEYSPACE, values $VALUE_SIZE B, --sync=true"
jq -r --argjson ticks "$((t1 - t0))" --argjson us "$((1000000 / $(getconf CLK_TCK)))" '"requests \(.requests), failures \(.non_2xx + .errors.connect + .errors.timeout + .errors.other), unsent \(.unsent // 0); latency from the intended send time: p50 \(.latency_us["50"]) µs, p99 \(.latency_us["99"]) µs, p99.9 \(.latency_us["99.9"]) µs, max \(.latency_us["100"]) µs; the servers'"'"' CPU \($ticks * $us / ([.requests, 1] | max) | floor) µs a request"' <<<"$out"
echo
printf "%6s %8s %9s %9s %10s %8s %8s %7s %9s\n" second rps "p50 µs" "p99 µs" "max µs" flushes compact stalls "cpu µs/r"
jq -r '.timeline[] | "\(.second) \(.requests) \(.p50_us) \(.p99_us) \(.max_us)"' <<<"$out" |
  awk -v start="$start" -v samples="$tmp/pebble" -v us="$((1000000 / $(getconf CLK_TCK)))" '
    BEGIN { while ((getline l < samples) > 0) { split(l, a, " "); n++; t[n] = a[1]; v["f", n] = a[2]; v["c", n] = a[3]; v["s", n] = a[4]; v["t", n] = a[5] } }
    function last(x,   i) { for (i = n; i > 1; i--) if (t[i] <= x) return i; return 1 }
    function at(x, col) { return v[col, last(x)] }
    # The CPU of a second: the ticks between the samples around it, over
    # the time between them (samples come about a second apart).
    function cpu(lo, hi,   a, b) { a = last(lo); b = last(hi); if (b <= a) b = a + 1; if (b > n) return 0
      return (v["t", b] - v["t", a]) * us / (t[b] - t[a]) }
    { sec = $1; lo = start + sec; hi = lo + 1
      printf "%6d %8d %9d %9d %10d %8d %8d %7d %9.1f\n", sec, $2, $3, $4, $5, at(hi, "f") - at(lo, "f"), at(hi, "c") - at(lo, "c"), at(hi, "s") - at(lo, "s"), ($2 > 0 ? cpu(lo, hi) / $2 : 0) }'
