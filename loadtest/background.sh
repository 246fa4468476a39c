#!/usr/bin/env bash
# What each mechanism that runs beside requests costs the foreground
# (issue 21, point 5): a 3-node cluster (ack=2, from=3, --sync=true) under
# PUT load, and in each run one mechanism set to work TRIGGER seconds in:
#
#   antientropy  POST /repair on every node, after RECORDS keys were
#                written to one replica only (from=1): each exchange
#                pushes and pulls them (--ae-rate);
#   hints        node 3 frozen (SIGSTOP) while RECORDS keys are written,
#                thawed at the trigger: the others replay its hints
#                (--hint-replay-rate);
#   rebuild      node 3 killed, its data directory wiped, started again:
#                it rebuilds its share from the others (--move-rate);
#   gc           RECORDS random deletes, --gc-grace (GC_GRACE) waited out,
#                (GC_GRACE, above HINT_WINDOW) then POST /repair: the exchanges that follow let each
#                node's collector remove the tombstones (a pass reads the
#                whole index).
#
# Each mechanism gets three runs (MODES): alone (no load: the cores the
# servers keep busy while it works, against those the closed-loop PUT load
# keeps busy; a measure the machine's other load moves little), and two
# of WINDOW under load: closed loop (throughput) and constant rate at
# FRACTION of the closed-loop rate (latency from the intended send time). Second by second the script prints the load's
# throughput and latency, marks the seconds the mechanism was at work
# (from the trigger until /repair answered, no hints are left, the
# rebuilt node reports it done, or the tombstones removed stop growing),
# and sums up the seconds with and without it. The load goes to nodes 1 and 2 only, so
# that freezing or restarting node 3 fails no client request. Only
# 127.0.0.1 is contacted.
#
#   loadtest/background.sh
#   MECHANISMS="hints rebuild" WINDOW=40s loadtest/background.sh
#
# RATE holds that constant rate instead of FRACTION of the closed loop's,
# so that two builds (DHTKV) are compared at the same load. CGROUPS=1
# starts each node in a cgroup of its own (where the cgroup2 file system
# is writable: as root), as on a machine or pod of its own: the kernel
# then shares the cores between the nodes, not between their threads, and
# each node's background pace reads its own CPU pressure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MECHANISMS=${MECHANISMS:-antientropy hints rebuild gc}
WINDOW=${WINDOW:-45s}
TRIGGER=${TRIGGER:-10}
FRACTION=${FRACTION:-0.5}
MODES=${MODES:-alone closed rate}
CONNECTIONS=${CONNECTIONS:-64}
KEYSPACE=${KEYSPACE:-100000}
RECORDS=${RECORDS:-50000}
VALUE_SIZE=${VALUE_SIZE:-1024}
HINT_WINDOW=${HINT_WINDOW:-60s}
GC_GRACE=${GC_GRACE:-70s}
PORT=${PORT:-18680}

tmp=$(mktemp -d)
pids=()
# A node a rebuild restarted inside a run's subshell is not in pids: the
# data directory names every node of this run.
cleanup() {
  kill -CONT "${pids[@]}" 2>/dev/null || true; kill "${pids[@]}" 2>/dev/null || true
  pkill -f -- "--data-dir $tmp/" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"
  [ -z "$CGROOT" ] || rmdir "$CGROOT"/*/ "$CGROOT" 2>/dev/null || true
}
CGROOT=""
if [ "${CGROUPS:-0}" = 1 ]; then
  cg2=$(awk '/ - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
  if [ -n "$cg2" ] && mkdir "$cg2/background-$$" 2>/dev/null; then CGROOT=$cg2/background-$$; fi
  echo "# each node in a cgroup of its own: ${CGROOT:-no (the cgroup2 file system is not writable here)}"
fi
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
if [ -n "${DHTKV:-}" ]; then cp "$DHTKV" "$tmp/dhtkv"; else (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); fi

ports=("$((PORT + 1))" "$((PORT + 2))" "$((PORT + 3))")
cluster=$(printf 'http://127.0.0.1:%s,' "${ports[@]}")
cluster=${cluster%,}
front="http://127.0.0.1:${ports[0]},http://127.0.0.1:${ports[1]}"
# Anti-entropy only on demand, and hints and tombstones short-lived enough
# for GC to collect within the run (the grace must exceed the hint window
# plus the clock skew bound).
FLAGS="--ae-interval 0 --hint-window $HINT_WINDOW --max-clock-skew 500ms --gc-grace $GC_GRACE ${NODE_FLAGS:-}"
declare -A npid
start_node() { # index (1-3)
  local p=${ports[$(($1 - 1))]} pre=()
  if [ -n "$CGROOT" ] && mkdir -p "$CGROOT/node$1"; then
    # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
    pre=(bash -c '{ echo $$ >"$0/cgroup.procs"; } 2>/dev/null || echo "background.sh: not moved into $0" >&2; exec "$@"' "$CGROOT/node$1")
  fi
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  "${pre[@]}" "$tmp/dhtkv" --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$((p + 10))" --data-dir "$tmp/n$p" \
    --cluster "$cluster" $FLAGS >>"$tmp/n$p.log" 2>&1 &
  pids+=($!)
  npid[$1]=$!
}
ready() { # index...
  local i p
  for i in "$@"; do
    p=${ports[$((i - 1))]}
    for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$((p + 10))/readyz" && break; sleep 0.1; done
  done
}
for i in 1 2 3; do start_node $i; done
ready 1 2 3
load() { # targets, then dhtkv-load flags... (its pid in $tmp/load.pid while it runs)
  "$tmp/dhtkv-load" --json --targets "$1" --ack 2 --from 3 --keyspace "$KEYSPACE" \
    --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" "${@:2}" 2>/dev/null &
  echo $! >"$tmp/load.pid"
  wait $!
}
# signal_load SIG: open (USR1) or close (USR2) the running load's marked
# window, so that it sums up the requests due while the mechanism worked.
source "$ROOT/loadtest/mark.sh"
signal_load() { mark_load "$tmp/load.pid" "$1"; }
source "$ROOT/loadtest/settle.sh"
load "$cluster" --workload put --duration 1s --fill "$KEYSPACE" >/dev/null
settle "${ports[@]}"
ticks() { local t=0 i; for i in 1 2 3; do t=$((t + $(awk '{print $14 + $15}' "/proc/${npid[$i]}/stat"))); done; echo $t; }
hz=$(getconf CLK_TCK)
t0=$(ticks)
out=$(load "$front" --workload put --duration 10s)
fgcores=$(awk -v t=$(($(ticks) - t0)) -v hz="$hz" 'BEGIN {printf "%.2f", t / hz / 10}')
closed=$(jq -r .throughput_rps <<<"$out")
rate=${RATE:-$(awk -v r="$closed" -v f="$FRACTION" 'BEGIN {printf "%d", r * f}')}

prepare() { # mechanism: the unmeasured work before a run
  case $1 in
  antientropy) # RECORDS keys past the load's keyspace, on one replica each
    load "$cluster" --ack 1 --from 1 --workload put --duration 1s --fill $((KEYSPACE + RECORDS)) --fill-only >/dev/null ;;
  hints)
    kill -STOP "${npid[3]}"
    load "$front" --workload put --duration 1s --fill $((KEYSPACE + RECORDS)) --fill-only --timeout 5s >/dev/null ;;
  gc) # tombstones past the load's keyspace (the load's PUTs would supersede the others)
    load "$cluster" --workload delete --keyspace $((KEYSPACE + 2 * RECORDS)) --duration 10s >/dev/null
    sleep "${GC_GRACE%s}" ;;
  esac
  if [ "$1" = hints ]; then settle "${ports[0]}" "${ports[1]}"; else settle "${ports[@]}"; fi # node 3 is frozen
}
metric() { # admin port, metric name prefix -> its samples summed
  curl -s -m 1 "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($1, m) == 1 {s += $2} END {printf "%d", s}'
}
repair() { # POST /repair on every node at once; returns when they answered
  local p cp=()
  for p in "${ports[@]}"; do curl -s -o /dev/null -X POST "http://127.0.0.1:$((p + 10))/repair" & cp+=($!); done
  wait "${cp[@]}"
}
trigger() { # mechanism: set it to work, wait until it is done, and write its start and end to $tmp/busy
  local p t0 last now
  t0=$(date +%s.%N)
  signal_load USR1
  case $1 in
  antientropy) # /repair answers once its exchanges are over
    repair ;;
  hints) # until no node holds hints
    kill -CONT "${npid[3]}"
    until [ "$(for p in "${ports[@]}"; do metric $((p + 10)) dhtkv_hints_pending_bytes; echo; done | awk '{s += $1} END {print s}')" = 0 ]; do sleep 0.2; done ;;
  rebuild) # until the wiped node has rebuilt its share
    kill -9 "${npid[3]}"; wait "${npid[3]}" 2>/dev/null || true
    rm -rf "$tmp/n${ports[2]}"
    start_node 3
    ready 3
    until [ "$(metric $((ports[2] + 10)) dhtkv_rebuilding)" = 0 ]; do sleep 0.2; done ;;
  gc) # exchanges, then the collectors' next passes: until the tombstones removed stop growing
    removed() { for p in "${ports[@]}"; do metric $((p + 10)) dhtkv_gc_removed_total; echo; done | awk '{s += $1} END {print s}'; }
    local before
    before=$(removed)
    repair
    last=-1
    for _ in $(seq 120); do # a pass runs at the collector's next minute tick
      now=$(removed)
      [ "$now" -gt "$before" ] && [ "$now" = "$last" ] && break
      last=$now
      sleep 1
    done ;;
  esac
  signal_load USR2
  echo "$t0 $(date +%s.%N)" >"$tmp/busy"
}

echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg), PUT ack=2 from=3 to nodes 1-2, closed loop $closed rps (servers $fgcores cores busy), constant rate $rate rps ($FRACTION), $CONNECTIONS connections, keyspace $KEYSPACE, records $RECORDS, values $VALUE_SIZE B, windows $WINDOW, trigger at ${TRIGGER}s; node flags: $FLAGS"
for m in $MECHANISMS; do
  for mode in $MODES; do
    prepare "$m"
    if [ "$mode" = alone ]; then # the mechanism without load: the cores it keeps busy
      t0=$(ticks)
      # The node a rebuild replaces is killed at once: its CPU is not the rebuild's.
      [ "$m" = rebuild ] && t0=$((t0 - $(awk '{print $14 + $15}' "/proc/${npid[3]}/stat")))
      trigger "$m" # in this shell: it sets npid[3] to the new node
      read -r b0 b1 <"$tmp/busy"
      echo
      echo "## $m, alone: at work $(awk -v a="$b0" -v b="$b1" 'BEGIN {printf "%.1f", b - a}') s, the servers' CPU $(awk -v t=$(($(ticks) - t0)) -v hz="$hz" -v a="$b0" -v b="$b1" -v fg="$fgcores" 'BEGIN {c = t / hz / (b - a); printf "%.2f cores, %.0f%% of the %.2f the closed-loop PUT load keeps busy", c, 100 * c / fg, fg}')"
      settle "${ports[@]}"
      continue
    fi
    rm -f "$tmp/busy"
    ( sleep "$TRIGGER"; trigger "$m" ) & trig=$!
    start=$(date +%s.%N)
    if [ $mode = closed ]; then
      out=$(load "$front" --workload put --duration "$WINDOW" --timeline)
    else
      out=$(load "$front" --workload put --rate "$rate" --duration "$WINDOW" --timeline)
    fi
    wait "$trig" 2>/dev/null || true
    if [ "$m" = rebuild ]; then # the restarted node's pid, for the next runs
      npid[3]=$(pgrep -f -- "--data-dir $tmp/n${ports[2]}" | head -1)
      ready 3
    fi
    echo
    echo "## $m, $mode: $(jq -r '"requests \(.requests), failures \(.non_2xx + .errors.connect + .errors.timeout + .errors.other); p50 \(.latency_us["50"]) µs, p99 \(.latency_us["99"]) µs, p99.9 \(.latency_us["99.9"]) µs, max \(.latency_us["100"]) µs"' <<<"$out")"
    echo "# the requests due while $m worked: $(jq -r 'if .marked then "\(.marked.requests), failures \(.marked.failures); p50 \(.marked.latency_us["50"]) µs, p99 \(.marked.latency_us["99"]) µs, p99.9 \(.marked.latency_us["99.9"]) µs, max \(.marked.latency_us["100"]) µs" else "none marked" end' <<<"$out")"
    jq -r '.timeline[] | "\(.second) \(.requests) \(.p50_us) \(.p99_us) \(.max_us)"' <<<"$out" |
      awk -v start="$start" -v busy="$(cat "$tmp/busy" 2>/dev/null || echo "0 0")" -v m="$m" '
        BEGIN { split(busy, b, " "); from = b[1] - start; to = b[2] - start
                printf "# %s at work from second %.1f to %.1f of the run\n", m, from, to }
        { k = ($1 + 1 > from && $1 < to) ? "busy" : "quiet"
          printf "%6d %8d rps %9d p50 µs %9d p99 µs %10d max µs  %s\n", $1, $2, $3, $4, $5, k == "busy" ? m : ""
          s[k]++; r[k] += $2; if ($4 > p[k]) p[k] = $4 }
        END { for (k in s) printf "# %s seconds: %d, mean %.0f rps, worst second p99 %d µs\n", k, s[k], r[k] / s[k], p[k]
              if (s["busy"] && s["quiet"]) printf "# throughput while busy: %.2f of quiet\n", (r["busy"] / s["busy"]) / (r["quiet"] / s["quiet"]) }'
    settle "${ports[@]}"
  done
done
