#!/usr/bin/env bash
# GETs over data ten times the read cache (issue 21, point 4): one node
# holding KEYSPACE keys (default 1M of 1 KiB) with a read cache sized for
# CACHE_KEYS of them (default 100k), against the in-memory baseline holding
# the same keys, alternated for ROUNDS rounds of wrk (uniform keys, so
# about nine GETs in ten miss the read cache and go to Pebble). Server CPU
# per request is read from /proc for every run. Then the node alone, held
# at FRACTION (default half) of its closed-loop GET rate for HOLD (default
# 60 s) with dhtkv-load --rate: latency from the intended send time,
# second by second. Only 127.0.0.1 is contacted.
#
#   loadtest/wrk/cache-misses.sh
#   KEYSPACE=200000 CACHE_KEYS=20000 HOLD=20s ROUNDS=1 loadtest/wrk/cache-misses.sh   # a quick look
#   NODE_FLAGS="--block-cache-bytes 1GiB" loadtest/wrk/cache-misses.sh                 # a node setting
#   NODE_FLAGS="--settle-after 0" SETTLE_WAIT=0 loadtest/wrk/cache-misses.sh          # the store left as the fill shaped it
KEYSPACE=${KEYSPACE:-1000000}
CACHE_KEYS=${CACHE_KEYS:-100000}
HOLD=${HOLD:-60s}
FRACTION=${FRACTION:-0.5}
source "$(dirname "$0")/setup.sh"
# The read cache for CACHE_KEYS entries: an entry costs about its value
# and key plus ristretto's and the envelope's overhead (setup.sh sizes a
# cache for the whole keyspace the same way).
cache=$(( CACHE_KEYS * (VALUE_SIZE + 128) * 2 ))

"$tmp/dhtkv-baseline" --listen 127.0.0.1:18180 >"$tmp/baseline.log" 2>&1 & pids+=($!)
bpid=$!
"$tmp/dhtkv" --listen 127.0.0.1:18181 --admin-listen 127.0.0.1:18191 --data-dir "$tmp/node" --cache-bytes $cache ${NODE_FLAGS:-} >"$tmp/node.log" 2>&1 & pids+=($!)
npid=$!
wait_up 18180 18181
prefill 18180 18181
source "$ROOT/loadtest/settle.sh"
settle 18181
# A node quiet for --settle-after (2 min) compacts its store into the
# bottom level (docs/storage.md, "Settling a quiet store"): what a node
# that was filled and is then read looks like. Wait for it, at most
# SETTLE_WAIT seconds (0: do not wait; with --settle-after 0 in
# NODE_FLAGS nothing comes).
settles() { curl -s http://127.0.0.1:18191/metrics | awk '$1 == "dhtkv_settles_total{result=\"done\"}" {printf "%d", $2}'; }
end=$((SECONDS + ${SETTLE_WAIT:-300}))
while [ "$(settles)" != 1 ] && ((SECONDS < end)); do sleep 1; done
echo "# settles done before the runs: $(settles)"
wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/get.lua" "http://127.0.0.1:18181" >/dev/null # warm-up
cachestat() { curl -s http://127.0.0.1:18191/metrics | awk -v m="dhtkv_cache_$1_total" '$1 == m {printf "%d", $2}'; }
# What a GET that misses the read cache consults in Pebble: its read
# amplification (memtables, L0 sublevels, non-empty levels) and L0 files.
lsm() { curl -s http://127.0.0.1:18191/metrics | awk '$1 == "dhtkv_pebble_read_amplification" {r = $2} $1 == "dhtkv_pebble_l0_files" {f = $2} END {printf "read amplification %d, L0 files %d", r, f}'; }
hits0=$(cachestat hits) misses0=$(cachestat misses)

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
declare -A results
run() { # name port pid
  local line t0 t1 reqs
  t0=$(ticks "$3")
  line=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$LUA/get.lua" "http://127.0.0.1:$2" | grep '^WRKRESULT')
  t1=$(ticks "$3")
  reqs=$(sed -E 's/.* requests=([0-9]+).*/\1/' <<<"$line")
  echo "$1 $line cpu_us_per_request=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v n="$reqs" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}')"
  results[$1]+="$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$line") "
}
echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg), $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, read cache $cache B (about $CACHE_KEYS entries), values $VALUE_SIZE B"
echo "# node's Pebble before the runs: $(lsm)"
for _ in $(seq "$ROUNDS"); do
  run ceiling-get 18180 "$bpid"
  run dhtkv-get 18181 "$npid"
done
hits=$(( $(cachestat hits) - hits0 )) misses=$(( $(cachestat misses) - misses0 ))
echo "read cache during the measured GET runs: $hits hits, $misses misses"
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
c=$(median "${results[ceiling-get]}") d=$(median "${results[dhtkv-get]}")
printf "median rps: ceiling %.0f, dhtkv %.0f, ratio %.2f\n" "$c" "$d" "$(awk -v a="$d" -v b="$c" 'BEGIN {print a / b}')"

# The tail at FRACTION of the node's closed-loop rate.
load() {
  "$tmp/dhtkv-load" --json --targets http://127.0.0.1:18181 --workload get --keyspace "$KEYSPACE" \
    --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" "$@" 2>/dev/null
}
closed=$(load --duration 10s | jq -r .throughput_rps)
rate=$(awk -v r="$closed" -v f="$FRACTION" 'BEGIN {printf "%d", r * f}')
out=$(load --rate "$rate" --duration "$HOLD" --timeline)
echo
echo "# GET held at $rate rps ($FRACTION of the closed loop's $closed) for $HOLD, load $(cut -d' ' -f1 /proc/loadavg)"
jq -r '"requests \(.requests), failures \(.non_2xx + .errors.connect + .errors.timeout + .errors.other), unsent \(.unsent // 0); latency from the intended send time: p50 \(.latency_us["50"]) µs, p99 \(.latency_us["99"]) µs, p99.9 \(.latency_us["99.9"]) µs, max \(.latency_us["100"]) µs"' <<<"$out"
jq -r '.timeline[] | "\(.second) \(.requests) \(.p50_us) \(.p99_us) \(.max_us)"' <<<"$out" |
  awk 'BEGIN {printf "%6s %8s %9s %9s %10s\n", "second", "rps", "p50 µs", "p99 µs", "max µs"} {printf "%6d %8d %9d %9d %10d\n", $1, $2, $3, $4, $5}'
