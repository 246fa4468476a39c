#!/usr/bin/env bash
# A membership change under load, with the real binaries: a 3-node cluster
# (--replicas 3) holding N keys takes a 4th node, then decommissions one of
# the original three, while dhtkv-load sends a constant RATE of mixed
# requests (10% PUT) with ack=2 from=3 through every member. Prints, per
# phase: how long the change took, the records and bytes copied against
# the ideal (what the gaining nodes hold of the moved partitions), the
# time per GiB, the rate the join streamed at (record bytes over the
# stream stage, and over the whole change), and what the clients saw
# (errors, p50/p99/max) next to a baseline run of the same load without a
# change.
#
#   loadtest/membership.sh                     # N=1000000 VALUE_SIZE=100 RATE=2000
#   N=200000 LOAD_S=40 loadtest/membership.sh
#   N=1000000 VALUE_SIZE=1024 MOVE_RATE=1GiB JOIN_ONLY=1 loadtest/membership.sh  # the join at disk speed
#   N=20000 VALUE_SIZE=1024 MOVE_RATE=1GiB JOIN_ONLY=1 LOAD_S=10 loadtest/membership.sh  # the same in seconds
#   N=1000000 VALUE_SIZE=1024 MOVE_RATE=1GiB REPLICAS_ONLY=1 loadtest/membership.sh  # 2 -> 3 replicas instead
#   KEEP=1 loadtest/membership.sh              # keep the nodes' logs and data
#   DHTKV=/tmp/dhtkv-main N=1000000 VALUE_SIZE=1024 JOIN_ONLY=1 loadtest/membership.sh  # A/B: one build, then
#   DHTKV=/tmp/dhtkv-drop N=1000000 VALUE_SIZE=1024 JOIN_ONLY=1 loadtest/membership.sh  # the other (docs/benchmarks.md section 19)
#
# READ_RATIO is the load's share of GETs (default 0.9; 1 reads only, 0
# writes only), to tell which of them a change slows.
# MOVE_RATE is the nodes' --move-rate (default theirs, 24MiB); DROP_RATE
# their --drop-rate (default theirs); NODE_FLAGS extra flags for every
# node; JOIN_ONLY=1 skips the decommission. REPLICAS_ONLY=1 measures a
# replication factor change instead: the three nodes start with
# --replicas 2 (filled and loaded with from=2), and `dhtkvctl replicas 3`
# under the same load makes each
# node the third replica of a third of the partitions (moves as a join's:
# streamed, then compared). DHTKV: the server binary
# (default: built from this repository), to compare two builds in one
# sitting. CGROUPS=1 starts each node in a cgroup of its own (where the
# cgroup2 file system is writable: as root), so that its background pace
# reads its own CPU pressure, as on a machine or pod of its own, instead
# of what every process here shares. NODE4_DIR=DIR keeps the joining
# node's data directory in DIR (/dev/shm: its writes reach no disk the
# others' WAL fsyncs wait on, as on a machine of its own).
#
# The join's run is printed second by second (dhtkv-load --timeline), each
# second beside what the nodes did in it, sampled from their /metrics once
# a second: the change's stage at node 1, the records the original nodes
# dropped (mover.cleanup), their Pebble compactions, flushes and
# compactions in progress, compaction debt and write stalls, the CPU
# seconds the four servers used, the generator's, and everything else's
# on the machine (from /proc/stat, less this run's processes: about ±0.3
# core), so that a stall can be matched with the drop, the compactions
# after it, or a neighbour. Each load run also says how many cores other
# processes took on average, and the load average before and after it:
# on a shared machine, figures from a busy one are not comparable.
# Only 127.0.0.1 is contacted (ports PORT+1..4, admin PORT+11..14; PORT
# defaults to 18680); every wait is bounded by WAIT_S seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-1000000}
VALUE_SIZE=${VALUE_SIZE:-100}
RATE=${RATE:-2000}
READ_RATIO=${READ_RATIO:-0.9} # the load's share of GETs (1: reads only, 0: writes only)
LOAD_S=${LOAD_S:-60}     # each load run; a change starts 5 s into its run
AE_RATE=${AE_RATE:-64MiB} # --ae-rate: the throttle of the comparison after a change's stream
MOVE_RATE=${MOVE_RATE:-}  # --move-rate: the stream's throttle (empty: the default)
DROP_RATE=${DROP_RATE:-}  # --drop-rate: the drop's pace after a change (empty: the default)
WAIT_S=${WAIT_S:-1800}
CONNECTIONS=${CONNECTIONS:-32}
PORT=${PORT:-18680}       # nodes listen on PORT+i, their admin listeners on PORT+10+i

tmp=$(mktemp -d)
declare -A pid=()
CGROOT=""
cleanup() {
  local p
  for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-}" ]; then echo "kept $tmp" >&2; else rm -rf "$tmp" ${NODE4_DIR:+"$NODE4_DIR/dhtkv-node4-$$"}; fi
  if [ -n "$CGROOT" ]; then rmdir "$CGROOT"/*/ "$CGROOT" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load && go build -o "$tmp/dhtkvctl" ./cmd/dhtkvctl)
if [ -n "${DHTKV:-}" ]; then cp "$DHTKV" "$tmp/dhtkv"; else (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); fi

if [ "${CGROUPS:-0}" = 1 ]; then
  cg2=$(awk '/ - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
  if [ -n "$cg2" ] && mkdir "$cg2/membership-$$" 2>/dev/null; then CGROOT=$cg2/membership-$$; fi
  echo "each node in a cgroup of its own: ${CGROOT:-no (the cgroup2 file system is not writable here)}"
fi

port() { echo $((PORT + $1)); }
admin() { echo $((PORT + 10 + $1)); }
url() { echo "http://127.0.0.1:$(port "$1")"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

start_node() { # i flags...
  local i=$1 pre=()
  shift
  if [ -n "$CGROOT" ] && mkdir -p "$CGROOT/node$i"; then
    # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
    pre=(bash -c '{ echo $$ >"$0/cgroup.procs"; } 2>/dev/null || echo "membership.sh: not moved into $0" >&2; exec "$@"' "$CGROOT/node$i")
  fi
  local dir=$tmp/node$i
  [ "$i" = 4 ] && [ -n "${NODE4_DIR:-}" ] && dir=$NODE4_DIR/dhtkv-node4-$$
  "${pre[@]}" "$tmp/dhtkv" --listen "127.0.0.1:$(port "$i")" --admin-listen "127.0.0.1:$(admin "$i")" \
    --data-dir "$dir" --ae-rate "$AE_RATE" --ae-interval 0 ${MOVE_RATE:+--move-rate "$MOVE_RATE"} \
    ${DROP_RATE:+--drop-rate "$DROP_RATE"} ${NODE_FLAGS:-} "$@" >>"$tmp/node$i.log" 2>&1 &
  pid[$i]=$!
}
wait_up() { # i
  local end=$((SECONDS + 60))
  until curl -sf -m 1 -o /dev/null "$(url "$1")/v0/status"; do
    ((SECONDS < end)) || { echo "node $1 did not come up" >&2; tail "$tmp/node$1.log" >&2; exit 1; }
    sleep 0.05
  done
}
metric() { # name node... -> the samples summed
  local name=$1 i
  shift
  for i in "$@"; do curl -s -m 5 "http://127.0.0.1:$(admin "$i")/metrics"; done |
    awk -v n="$name" '$1 == n {s += $2} END {printf "%.0f", s}'
}
held() { # node -> records in its store (local scan count from the stream's end marker)
  curl -sf -m 600 "$(url "$1")/v0/entities?start=k&end=l&format=json" | wc -l
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load() { # name targets [dhtkv-load flags...] -> dhtkv-load JSON in $tmp/$name.json
  local name=$1 targets=$2
  shift 2
  echo "load average before $name: $(loadavg)"
  "$tmp/dhtkv-load" --targets "$targets" --workload mixed --read-ratio "$READ_RATIO" --keyspace "$N" --value-size "$VALUE_SIZE" \
    --rate "$RATE" --duration "${LOAD_S}s" --ack 2 --from "$replicas" --connections "$CONNECTIONS" --json "$@" >"$tmp/$name.json" 2>"$tmp/$name.log" &
  echo $! >"$tmp/generator.pid"
  wait $! || true
  echo "load average after $name: $(loadavg)"
}
sample() { # node... -> one line: time, change stage at node 1, load average, machine busy and generator CPU ticks, then per node "dropped compactions stalls jobs debt cpu_ticks"
  local i out
  for i in "$@"; do curl -s -m 1 "http://127.0.0.1:$(admin "$i")/metrics" >"$tmp/metrics$i" 2>/dev/null & done
  wait
  out="$(now) $(awk '$1 == "dhtkv_membership_change_stage" {s = $2} END {print s == "" ? "?" : s}' "$tmp/metrics1") $(cut -d' ' -f1 /proc/loadavg)"
  out+=" $(awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat)"
  out+=" $(awk '{print $14 + $15}' "/proc/$(cat "$tmp/generator.pid" 2>/dev/null)/stat" 2>/dev/null || echo 0)"
  for i in "$@"; do
    out+=" $(awk '$1 == "dhtkv_membership_dropped_records_total" {d = $2} $1 == "dhtkv_pebble_compactions_total" {c = $2}
           $1 == "dhtkv_pebble_write_stalls_total" {s = $2} $1 == "dhtkv_pebble_background_jobs" {j = $2}
           $1 == "dhtkv_pebble_compaction_debt_bytes" {b = $2} END {printf "%d %d %d %d %d", d, c, s, j, b}' "$tmp/metrics$i")"
    out+=" $(awk '{print $14 + $15}' "/proc/${pid[$i]}/stat" 2>/dev/null || echo 0)"
  done
  echo "$out"
}
lsm() { # node... -> each node's L0 files and sublevels, and compaction debt
  local i
  for i in "$@"; do
    curl -s -m 5 "http://127.0.0.1:$(admin "$i")/metrics" | awk -v i="$i" '$1 == "dhtkv_pebble_l0_files" {f = $2}
      $1 == "dhtkv_pebble_l0_sublevels" {s = $2} $1 == "dhtkv_pebble_compaction_debt_bytes" {d = $2}
      END {printf "node %d: L0 %d files in %d sublevels, compaction debt %.0f MB; ", i, f, s, d / 1048576}'
  done
  echo
}
timeline() { # name -> the run second by second beside the nodes' samples ($tmp/$name.samples, $tmp/$name.start)
  echo "$1 second by second. stage: node 1's change stage (0 none, 1 write-both, 2 stream, 3 read-new); dropped, compact, stalls: records dropped, Pebble compactions ended and write stalls begun, nodes 1-3 together; jobs: their flushes and compactions in progress and debt: their compaction debt (MB), at the second's end; CPU seconds used in the second by the four servers together (cpu), by dhtkv-load (gen), and by everything else on the machine (other: neighbours; $(nproc) cores in all); load: the 1-minute load average. The node and CPU columns are interpolated from samples about a second apart:"
  printf "%6s %6s %5s %9s %9s %10s %5s %8s %7s %6s %4s %6s %5s %5s %5s %5s\n" second rps fail "p50 ms" "p99 ms" "max ms" stage dropped compact stalls jobs debt cpu gen other load
  jq -r '.timeline[] | "\(.second) \(.requests) \(.failures) \(.p50_us) \(.p99_us) \(.max_us)"' "$tmp/$1.json" |
    awk -v start="$(cat "$tmp/$1.start")" -v samples="$tmp/$1.samples" -v hz="$(getconf CLK_TCK)" '
      BEGIN { while ((getline l < samples) > 0) { m = split(l, a, " "); n++; t[n] = a[1]; st[n] = a[2]; la[n] = a[3]
                split("d c s j b u", cols, " "); for (q in cols) v[n, cols[q]] = 0
                v[n, "busy"] = a[4] / hz; v[n, "g"] = a[5] / hz
                for (j = 6; j + 5 <= m; j += 6) {
                  if (j < 24) { v[n, "d"] += a[j]; v[n, "c"] += a[j + 1]; v[n, "s"] += a[j + 2]; v[n, "j"] += a[j + 3]; v[n, "b"] += a[j + 4] }
                  v[n, "u"] += a[j + 5] / hz } } }
      function at(x, col,   i, f) { # col at time x, linear between the samples around it
        if (x <= t[1]) return v[1, col]
        for (i = 2; i <= n; i++) if (t[i] >= x) { f = (x - t[i - 1]) / (t[i] - t[i - 1]); return v[i - 1, col] + f * (v[i, col] - v[i - 1, col]) }
        return v[n, col] }
      function near(x,   i) { for (i = n; i > 1; i--) if (t[i] <= x) return i; return 1 }
      function d(col) { return at(hi, col) - at(lo, col) }
      { lo = start + $1; hi = lo + 1; k = near(hi); other = d("busy") - d("u") - d("g")
        printf "%6d %6d %5d %9.1f %9.1f %10.1f %5s %8d %7.1f %6.1f %4d %6.0f %5.2f %5.2f %5.2f %5s\n", $1, $2, $3, $4 / 1000, $5 / 1000, $6 / 1000,
          st[k], d("d"), d("c"), d("s"), v[k, "j"], v[k, "b"] / 1048576, d("u"), d("g"), other < 0 ? 0 : other, la[k] }'
}
neighbours() { # name -> the CPU that processes other than this run's took during it, from $tmp/$name.samples
  awk -v hz="$(getconf CLK_TCK)" -v cores="$(nproc)" '{ m = split($0, a, " "); mine = a[5]; for (j = 11; j <= m; j += 6) mine += a[j]
      if (NR == 1) { t0 = a[1]; b0 = a[4]; m0 = mine } t1 = a[1]; b1 = a[4]; m1 = mine; l += a[3]; n++ }
    END { if (n < 2) exit; printf "other processes used %.2f of %d cores on average (load average %.1f)", (b1 - b0 - (m1 - m0)) / hz / (t1 - t0), cores, l / n }' "$tmp/$1.samples"
}
summary() { # name -> requests, failures (non-2xx other than 404, transport errors), latencies
  jq -r '"\(.requests) requests, \((.status | to_entries | map(select(.key != "200" and .key != "201" and .key != "404") | .value) | add // 0) + .errors.connect + .errors.timeout + .errors.other) failed, status \(.status | tostring), p50 \(.latency_us."50" / 1000) ms, p99 \(.latency_us."99" / 1000) ms, max \(.latency_us."100" / 1000) ms"' "$tmp/$1.json" 2>/dev/null ||
    { echo "no report:" >&2; cat "$tmp/$1.log" >&2; }
}
marked() { # name -> the requests due while the change ran (the generator's marked window: mark/unmark)
  jq -r 'if .marked then "\(.marked.requests) requests in \(if .marked.to_s then "\((.marked.to_s - .marked.from_s) * 10 | floor / 10) s" else "the rest of the run" end), \(.marked.failures) failed, p50 \(.marked.latency_us."50" / 1000) ms, p99 \(.marked.latency_us."99" / 1000) ms, p99.9 \(.marked.latency_us."99.9" / 1000) ms, max \(.marked.latency_us."100" / 1000) ms" else "no marked window" end' "$tmp/$1.json" 2>/dev/null
}
# mark and unmark open and close the running load generator's marked
# window (dhtkv-load: SIGUSR1, SIGUSR2): a change's start and end.
source "$ROOT/loadtest/mark.sh"
mark() { mark_load "$tmp/generator.pid" USR1; }
unmark() { mark_load "$tmp/generator.pid" USR2; }
await_done() { # admin-node -> seconds until its map has no change
  local t0 end
  t0=$(now)
  end=$((SECONDS + WAIT_S))
  until curl -s -m 5 "http://127.0.0.1:$(admin "$1")/cluster" | jq -e '.map.change == null' >/dev/null; do
    ((SECONDS < end)) || { echo "the change did not complete" >&2; exit 1; }
    sleep 0.2
  done
  since "$t0"
}

cluster="$(url 1),$(url 2),$(url 3)"
replicas=3
[ "${REPLICAS_ONLY:-}" ] && replicas=2
for i in 1 2 3; do start_node "$i" --cluster "$cluster" --replicas "$replicas"; done
for i in 1 2 3; do wait_up "$i"; done
t0=$(now)
"$tmp/dhtkv-load" --targets "$cluster" --fill "$N" --fill-only --keyspace "$N" --value-size "$VALUE_SIZE" \
  --ack "$replicas" --from "$replicas" --connections "$CONNECTIONS" 2>"$tmp/fill.log" || { cat "$tmp/fill.log" >&2; exit 1; }
echo "filled $N keys of $VALUE_SIZE bytes in $(since "$t0") s"
echo "LSM after the fill: $(lsm 1 2 3)"

(while :; do sample 1 2 3; sleep 1; done) >"$tmp/baseline3.samples" &
sampler=$!
load baseline3 "$cluster"
kill "$sampler" 2>/dev/null || true
echo "baseline (3 nodes, no change): $(summary baseline3); $(neighbours baseline3)"

if [ "${REPLICAS_ONLY:-}" ]; then
  # 2 -> 3 replicas, driven by node 1, under load through nodes 1-3.
  before=$(metric dhtkv_membership_moved_bytes_total 1 2 3)
  before_rec=$(metric dhtkv_membership_moved_records_total 1 2 3)
  start_replicas() {
    sleep 5
    mark
    "$tmp/dhtkvctl" replicas --admin "127.0.0.1:$(admin 1)" --no-wait 3 >"$tmp/replicas.out"
    await_done 1 >"$tmp/replicas.secs"
    unmark
  }
  start_replicas &
  changer=$!
  (while :; do sample 1 2 3; sleep 1; done) >"$tmp/replicas.samples" &
  sampler=$!
  now >"$tmp/replicas.start"
  load replicas "$cluster" --timeline
  kill "$sampler" 2>/dev/null || true
  wait "$changer"
  moved=$(( $(metric dhtkv_membership_moved_bytes_total 1 2 3) - before ))
  moved_rec=$(( $(metric dhtkv_membership_moved_records_total 1 2 3) - before_rec ))
  echo "replicas 2 -> 3: $(cat "$tmp/replicas.secs") s; nodes 1-3 copied $moved_rec records, $moved bytes ($(awk -v b="$moved" -v s="$(cat "$tmp/replicas.secs")" 'BEGIN {printf "%.1f MB/s over the whole change", b / 1e6 / s}')); ideal: $N records, one more copy of each"
  echo "replicas load: $(summary replicas); $(neighbours replicas)"
  echo "replicas load during the change: $(marked replicas)"
  grep -h 'membership: partitions copied' "$tmp"/node[123].log | sed 's/^/replicas copy: /' || true
  timeline replicas
  for i in 1 2 3; do echo "node $i holds $(held "$i") records"; done
  exit 0
fi

# Join: node 4 starts with --join after the change began.
start_join() {
  sleep 5
  "$tmp/dhtkvctl" join --admin "127.0.0.1:$(admin 1)" --no-wait "$(url 4)" >"$tmp/join.out"
  await_done 1 >"$tmp/join.secs"
  unmark
}
start_join &
joiner=$!
# Node 4 starts once the join began (it must be in the map), in this shell,
# so that cleanup stops it.
until curl -s -m 5 "http://127.0.0.1:$(admin 1)/cluster" | jq -e '.map.change != null' >/dev/null; do sleep 0.1; done
echo "LSM before the join: $(lsm 1 2 3)"
start_node 4 --join "$(url 1)"
(while :; do sample 1 2 3 4; sleep 1; done) >"$tmp/join.samples" &
sampler=$!
now >"$tmp/join.start"
# The join began before its load: the window opens with the load.
load join "$cluster" --timeline --marked-from-start
kill "$sampler" 2>/dev/null || true
wait "$joiner"
moved_rec=$(metric dhtkv_membership_moved_records_total 4)
moved_bytes=$(metric dhtkv_membership_moved_bytes_total 4)
others=$(metric dhtkv_membership_moved_records_total 1 2 3)
h4=$(held 4)
echo "join: $(cat "$tmp/join.secs") s; node 4 copied $moved_rec records, $moved_bytes bytes; holds $h4 records; the original nodes copied $others"
echo "join load: $(summary join); $(neighbours join)"
echo "join load during the change: $(marked join)"
grep -h 'membership: dropped the partitions not held' "$tmp"/node[123].log | sed 's/^/join drop: /' || true
timeline join
echo "LSM after the join's load: $(lsm 1 2 3)"
rec_bytes=$((VALUE_SIZE + 8 + 10 + 10)) # value, key k<n> (~8), record header and framing (~20)
awk -v m="$moved_bytes" -v h="$h4" -v r="$rec_bytes" -v s="$(cat "$tmp/join.secs")" \
  'BEGIN {ideal = h * r; printf "join bytes: moved/ideal = %.2f (ideal %.0f MiB: records node 4 holds x %d B); %.0f s per GiB moved\n", m / ideal, ideal / 1048576, r, s / (m / 1073741824)}'
# The stream stage as node 4 logged it: the bytes its partition streams
# carried (keys and record envelopes) and the time they took.
copied=$(grep 'membership: partitions copied' "$tmp/node4.log" | tail -1)
streamed_bytes=$(sed -n 's/.* streamed_bytes=\([0-9]*\).*/\1/p' <<<"$copied")
streamed_in=$(sed -n 's/.* streamed_in=\([0-9.hms]*\).*/\1/p' <<<"$copied")
took=$(sed -n 's/.* took=\([0-9.hms]*\).*/\1/p' <<<"$copied")
secs() { # a Go duration (1m2.5s, 850ms, 3.2s) -> seconds
  awk -v d="$1" 'BEGIN {s = 0; if (d ~ /ms$/) {sub(/ms$/, "", d); print d / 1000; exit}
    if (match(d, /^[0-9]+h/)) {s += substr(d, 1, RLENGTH - 1) * 3600; d = substr(d, RLENGTH + 1)}
    if (match(d, /^[0-9]+m/)) {s += substr(d, 1, RLENGTH - 1) * 60; d = substr(d, RLENGTH + 1)}
    sub(/s$/, "", d); print s + d}'
}
awk -v b="$streamed_bytes" -v st="$(secs "$streamed_in")" -v t="$(secs "$took")" -v c="$(cat "$tmp/join.secs")" \
  'BEGIN {printf "join stream: %.0f MB of records streamed in %.1f s: %.1f MB/s (the whole copy, with the comparison after it: %.1f s, %.1f MB/s; the whole change: %.1f s, %.1f MB/s)\n", b / 1e6, st, b / 1e6 / st, t, b / 1e6 / t, c, b / 1e6 / c}'
if [ "${JOIN_ONLY:-}" ]; then exit 0; fi

# Decommission node 1, driven by node 2, under load through nodes 2-4.
before=$(metric dhtkv_membership_moved_bytes_total 2 3 4)
start_decom() {
  sleep 5
  mark
  "$tmp/dhtkvctl" decommission --admin "127.0.0.1:$(admin 2)" --no-wait "$(url 1)" >"$tmp/decom.out"
  await_done 2 >"$tmp/decom.secs"
  unmark
}
start_decom &
decom=$!
load decom "$(url 2),$(url 3),$(url 4)"
wait "$decom"
after=$(metric dhtkv_membership_moved_bytes_total 2 3 4)
echo "decommission: $(cat "$tmp/decom.secs") s; nodes 2-4 copied $((after - before)) bytes"
echo "decommission load: $(summary decom)"
echo "decommission load during the change: $(marked decom)"
end=$((SECONDS + 60))
while kill -0 "${pid[1]}" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
kill -0 "${pid[1]}" 2>/dev/null && echo "node 1 still running" || echo "node 1 stopped by itself"
for i in 2 3 4; do echo "node $i holds $(held "$i") records"; done
