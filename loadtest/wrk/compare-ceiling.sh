#!/usr/bin/env bash
# Measures one dhtkv node against the ceiling, the in-memory baseline server
# (cmd/dhtkv-baseline), in ONE run, alternating wrk runs (baseline, node
# --sync=true, node --sync=false) for several rounds so that noise on this
# shared machine hits all of them alike. Prints every run's WRKRESULT line
# and the median ratios; the baseline's runs are labelled ceiling-*.
#
# GETs go to a node of their own that never sees the PUT runs, warmed by one
# unmeasured GET run, so that they are the cache hits the issue asks about:
# a PUT run before each GET run would invalidate most of the read cache and
# leave Pebble compacting during the GETs. The script prints the read
# cache's hit ratio over the measured GET runs. After each dhtkv PUT run it
# waits until that node's Pebble is quiet (settle.sh).
#
#   loadtest/wrk/compare-ceiling.sh            # defaults below
#   ROUNDS=5 DURATION=15s loadtest/wrk/compare-ceiling.sh
#
# Builds what it runs from this repository. Only 127.0.0.1 is contacted.
# Needs wrk (apt-get install -y wrk).
source "$(dirname "$0")/setup.sh"
source "$ROOT/loadtest/settle.sh"

"$tmp/dhtkv-baseline" --listen 127.0.0.1:18080 >"$tmp/baseline.log" 2>&1 & pids+=($!)
"$tmp/dhtkv" --listen 127.0.0.1:18081 --admin-listen 127.0.0.1:18091 --data-dir "$tmp/sync" --cache-bytes $cache >"$tmp/sync.log" 2>&1 & pids+=($!)
"$tmp/dhtkv" --listen 127.0.0.1:18082 --admin-listen 127.0.0.1:18092 --data-dir "$tmp/nosync" --sync=false --cache-bytes $cache >"$tmp/nosync.log" 2>&1 & pids+=($!)
"$tmp/dhtkv" --listen 127.0.0.1:18083 --admin-listen 127.0.0.1:18093 --data-dir "$tmp/get" --cache-bytes $cache >"$tmp/get.log" 2>&1 & pids+=($!)
wait_up 18080 18081 18082 18083
prefill 18080 18081 18083
wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/get.lua" "http://127.0.0.1:18083" >/dev/null # warm-up
cachestat() { curl -s http://127.0.0.1:18093/metrics | awk -v m="dhtkv_cache_$1_total" '$1 == m {printf "%d", $2}'; }
hits0=$(cachestat hits) misses0=$(cachestat misses)

declare -A results
run() { # name port script
  local line
  line=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$LUA/$3" "http://127.0.0.1:$2" | grep '^WRKRESULT')
  echo "$1 $line"
  results[$1]+="$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$line") "
}
echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, values $VALUE_SIZE B"
for r in $(seq "$ROUNDS"); do
  run ceiling-get 18080 get.lua
  run dhtkv-get 18083 get.lua
  run ceiling-put 18080 put.lua
  run dhtkv-put-sync 18081 put.lua
  settle 18081
  run dhtkv-put-nosync 18082 put.lua
  settle 18082
done
hits=$(( $(cachestat hits) - hits0 )) misses=$(( $(cachestat misses) - misses0 ))
echo "read cache during the measured dhtkv-get runs: $hits hits, $misses misses"
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
printf "%-18s %12s %8s\n" run "median rps" "ratio"
for k in ceiling-get dhtkv-get ceiling-put dhtkv-put-sync dhtkv-put-nosync; do
  m=$(median "${results[$k]}")
  case $k in *get) base=$(median "${results[ceiling-get]}");; *) base=$(median "${results[ceiling-put]}");; esac
  printf "%-18s %12.0f %7.0f%%\n" "$k" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN{print 100*a/b}')"
done
