#!/usr/bin/env bash
# One dhtkv node against the in-memory baseline (cmd/dhtkv-baseline) at
# several server core counts, servers and wrk pinned to disjoint cores
# (taskset; the baseline with GOMAXPROCS equal to its cores, dhtkv with
# its own default, at least --min-procs, or NODE_PROCS), in ONE run:
# for each count, GET (read cache holding every key), PUT --sync=true and
# PUT --sync=false, baseline and node alternated for ROUNDS rounds. Prints
# every run with the server's CPU per request (user+system ticks from
# /proc/PID/stat over the run) and a table of median rps, ratio to the
# baseline and CPU per request.
#
#   loadtest/wrk/scaling.sh                 # CORES: the counts that leave wrk at least one core
#   CORES="1 2 4 8" loadtest/wrk/scaling.sh # on a 16-core machine
#   NODE_FLAGS="--wal-min-sync-interval 0" loadtest/wrk/scaling.sh   # flags for every dhtkv node
#   NODE_PROCS=1 loadtest/wrk/scaling.sh    # GOMAXPROCS of the dhtkv nodes (default: dhtkv's own)
#
# A count runs only where the machine has more cores than it: wrk gets
# the cores above the servers'. On a 2-core machine that is 1 (server on
# core 0, wrk on core 1). Builds what it runs from this repository. Only
# 127.0.0.1 is contacted. Needs wrk and taskset.
CONNECTIONS=${CONNECTIONS:-256}
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-2}
source "$(dirname "$0")/setup.sh"
source "$ROOT/loadtest/settle.sh"
command -v taskset >/dev/null || { echo "taskset missing (util-linux)" >&2; exit 1; }
ncpu=$(nproc)
if [ -z "${CORES:-}" ]; then
  CORES=""
  for n in 1 2 4 8; do [ "$n" -lt "$ncpu" ] && CORES+="$n "; done
fi
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A rps cpu
echo "# $ncpu cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, values $VALUE_SIZE B, node flags: ${NODE_FLAGS:-none}, node GOMAXPROCS: ${NODE_PROCS:-its default}"

for n in $CORES; do
  [ "$n" -lt "$ncpu" ] || { echo "skipping $n cores: the machine has $ncpu" >&2; continue; }
  srv="0-$((n - 1))" gen="$n-$((ncpu - 1))"
  start() { # name port [flags]: a server pinned to $srv, its pid in $pid
    local name=$1 port=$2
    shift 2
    if [ "$name" = baseline ]; then
      GOMAXPROCS=$n taskset -c "$srv" "$tmp/dhtkv-baseline" --listen "127.0.0.1:$port" >"$tmp/$name-$n.log" 2>&1 &
    else
      env ${NODE_PROCS:+GOMAXPROCS=$NODE_PROCS} taskset -c "$srv" "$tmp/dhtkv" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 10))" \
        --data-dir "$tmp/$name-$n" --cache-bytes $cache ${NODE_FLAGS:-} "$@" >"$tmp/$name-$n.log" 2>&1 &
    fi
    pid=$!
    pids+=("$pid")
  }
  start baseline 18480; base_pid=$pid
  start sync 18481; sync_pid=$pid
  start nosync 18482 --sync=false; nosync_pid=$pid
  start get 18483; get_pid=$pid
  wait_up 18480 18481 18482 18483
  prefill 18480 18481 18482 18483
  taskset -c "$gen" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/get.lua" http://127.0.0.1:18483 >/dev/null # warm-up
  run() { # series pid port script
    local t0 t1 line req
    t0=$(ticks "$2")
    line=$(taskset -c "$gen" wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$LUA/$4" "http://127.0.0.1:$3" | grep '^WRKRESULT')
    t1=$(ticks "$2")
    req=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$line")
    echo "$n-core $1 $line cpu_us=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$req" 'BEGIN{printf "%.2f", d * 1e6 / hz / n}')"
    rps[$n-$1]+="$(sed -E 's/.* rps=([0-9.]+).*/\1/' <<<"$line") "
    cpu[$n-$1]+="$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$req" 'BEGIN{printf "%.2f", d * 1e6 / hz / n}') "
  }
  for _ in $(seq "$ROUNDS"); do
    run baseline-get $base_pid 18480 get.lua
    run dhtkv-get $get_pid 18483 get.lua
    run baseline-put $base_pid 18480 put.lua
    run dhtkv-put-sync $sync_pid 18481 put.lua
    settle 18481
    run dhtkv-put-nosync $nosync_pid 18482 put.lua
    settle 18482
  done
  kill $base_pid $sync_pid $nosync_pid $get_pid
  wait $base_pid $sync_pid $nosync_pid $get_pid 2>/dev/null || true
done

median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
printf "%-6s %-18s %10s %7s %12s\n" cores run "rps" "ratio" "cpu µs/req"
for n in $CORES; do
  [ -n "${rps[$n-baseline-get]:-}" ] || continue
  for k in baseline-get dhtkv-get baseline-put dhtkv-put-sync dhtkv-put-nosync; do
    m=$(median "${rps[$n-$k]}")
    case $k in *get) b=$(median "${rps[$n-baseline-get]}");; *) b=$(median "${rps[$n-baseline-put]}");; esac
    printf "%-6s %-18s %10.0f %6.2f %12s\n" "$n" "$k" "$m" "$(awk -v a="$m" -v b="$b" 'BEGIN{print a/b}')" "$(median "${cpu[$n-$k]}")"
  done
done
