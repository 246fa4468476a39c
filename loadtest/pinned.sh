#!/usr/bin/env bash
# The highload issue's figures on a many-core machine (issue 21): servers
# and load generator on disjoint cores (taskset; each program with Go's
# default GOMAXPROCS for them, its cores, and dhtkv at least its
# --min-procs), server CPU per request from /proc/PID/stat, 1 KiB
# values, 100k keys, read caches that hold every key.
#
#   A  one node against dhtkv-baseline on 4 cores: GET hit, PUT fsync,
#      PUT --sync=false, 64 and 256 connections (points 1)
#   B  the same at 1, 2 and 8 cores, 256 connections (point 1)
#   C  3 nodes on 2 cores each (ack=2, from=3) against one node on 2
#      cores: throughput and CPU per request summed over the nodes
#      (point 2); every key read on every replica before the GET runs;
#      and the cluster's 90/10 mix in a closed loop of its own
#   D  the cluster held at half its closed-loop rate for HOLD (60s) each:
#      PUT, GET, 90/10 mix, latency from the intended send time, with the
#      worst seconds of the timeline and the CPU per request (point 3);
#      HOLDS picks which of them (default "put get mixed");
#      HOLD_PROFILE=SECONDS, node 1's CPU, mutex and block profiles for
#      that long from a third into each hold (with LOGS: cpu-d-W.pprof,
#      mutex-d-W.pprof, block-d-W.pprof; the mutex and block rates, 1 in
#      100 events and one per 1 ms blocked, only for that window)
#   E  (not by default) the cluster's PUT tail at one rate (half of the
#      first setting's closed loop) for each GOMAXPROCS in PROCS (default
#      "2 8") of nodes on 2 cores each: do more Ps than cores keep requests
#      from waiting behind Pebble's flushes and compactions (--min-procs)?
#   F  (not by default) one node on one core, GET hit and PUT fsync, for
#      each GOMAXPROCS in PROCS1 (default "8 4 2 1 4 8": alternated), the
#      baseline on the same core first: how many Ps a one-core node wants
#   G  (not by default) a join of JOIN_N (1000000) records of 1 KiB, 3 -> 4
#      nodes on 2 cores each, --move-rate JOIN_MOVE_RATE (64MiB), under a
#      90/10 GET/PUT load at JOIN_RATE (10000/s) for JOIN_LOAD (60s),
#      beside the same load with no change: the stream's MB/s and the
#      clients' tail during the join, in one run (issue 24, point 2);
#      JOIN_FLAGS, more flags for the four nodes (--background-cpu-pressure 0);
#      JOIN_PROFILE=SECONDS, node 1's (a source's) CPU, mutex and block
#      profiles and node 4's CPU profile for that long from 3 s into the
#      join (with LOGS: cpu-g-join.pprof, mutex-g-join.pprof,
#      block-g-join.pprof, cpu-g4.pprof); where each core's time went over the join and over
#      the load without a change (/proc/stat: the old nodes' cores, node
#      4's, the generator's; the servers' own CPU; the kernel's threads
#      that ran most); WRITEBACK_CPUS=LIST runs the kernel's unbound
#      work queues (page writeback among them) on those cores only
#      during G, restored after: on one machine every node's disk
#      writes are flushed by kernel threads that run on any core, the old
#      nodes' included, which separate machines would not share;
#      JOIN_DIR4=DIR puts node 4's data directory in DIR (/dev/shm: its
#      writes then reach no disk the old nodes' WAL fsyncs wait on)
#
# SCHED_SLICE_NS=N gives every thread of every dhtkv server a kernel time
# slice of N ns (100000 to 100000000; the kernel's default is 0.7 ms
# times 1 + log2 of the cores, at most 8: 2.8 ms on 16): a shorter slice
# lets a thread that wakes preempt the running one sooner.
#
# SECTIONS picks them (default "A B C D").
# Binaries come from BIN (default bin/: dhtkv, dhtkv-load,
# dhtkv-baseline, and dhtkvctl for G; `make build`), so that the script runs where no Go
# toolchain is; DHTKV=PATH runs another server binary (named dhtkv), to
# compare two builds. Needs 16 cores (servers on 0-7, the generator on 8-15);
# SMALL=1 runs it all on the cores there are, as a smoke test. Uses only
# taskset, python3 and bash's /dev/tcp; contacts only 127.0.0.1. LOGS=DIR
# keeps there every server's log, dhtkv's at level debug (each flush and
# compaction with its time), each run's JSON with its timeline (runs.tsv:
# when each began), and for the clusters of D and G each node's metrics
# once a second (metrics-*.tsv: the background pace's factor and signals,
# GC pauses, CPU, bytes moved): to place a slow second of a timeline. On
# the lent machine: LOGS=/tmp/logs, then one tar of it into $OUT.
#
#   loadtest/pinned.sh                    # about 7 minutes
#   SMALL=1 DUR=2s HOLD=5s loadtest/pinned.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BIN:-$ROOT/bin}
DHTKV=${DHTKV:-$B/dhtkv}
DUR=${DUR:-5s}
HOLD=${HOLD:-60s}
KS=100000
tmp=$(mktemp -d /tmp/pinned.XXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
  [ -n "${LOGS:-}" ] && mkdir -p "$LOGS" && cp "$tmp"/*.log "$tmp"/*.json "$tmp"/*.tsv "$tmp"/*.pprof "$LOGS"/ 2>/dev/null
  rm -rf "$tmp" ${G4DIR:+"$G4DIR"}
  [ -n "$CGROOT" ] && rmdir "$CGROOT"/*/ "$CGROOT" 2>/dev/null
  local f
  for f in "${!WQ_SAVED[@]}"; do echo "${WQ_SAVED[$f]}" >"$f" 2>/dev/null; done
}
declare -A WQ_SAVED
# Each server in a cgroup of its own (CGROUPS=1, the default, where the
# cgroup2 file system is writable: as root), so that each node's
# background pace reads its own CPU pressure, as on a machine or pod of
# its own, rather than the whole machine's (docs/replication.md).
CGROOT=""
if [ "${CGROUPS:-1}" = 1 ]; then
  cg2=$(awk '/ - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
  if [ -n "$cg2" ] && mkdir "$cg2/pinned-$$" 2>/dev/null; then CGROOT=$cg2/pinned-$$; fi
fi
trap cleanup EXIT
if [ "${SMALL:-0}" = 1 ]; then
  GEN=0; S1=0; S2=0; S4=0; S8=0; C1=0; C2=0; C3=0; N2=0
else
  GEN=8-15; S1=0; S2=0-1; S4=0-3; S8=0-7; C1=0-1; C2=2-3; C3=4-5; N2=6-7
fi
echo "# $(date -u +%FT%TZ) $(nproc) cpus,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), kernel $(uname -r), $("$DHTKV" --version 2>/dev/null | head -1)"
echo "# taskset -c $GEN gives: $(taskset -c $GEN grep Cpus_allowed_list /proc/self/status | cut -f2)"
echo "# each server in a cgroup of its own: ${CGROOT:-no (every node reads the whole machine CPU pressure)}"

# CPU ticks (user + system) of the processes given, and microseconds a tick
ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo $t; }
US_PER_TICK=$((1000000 / $(getconf CLK_TCK)))
up() { local port; for port in "$@"; do for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done; done; sleep 0.3; }
start() { # name cores port binary flags...: a pinned server, its pid in PID_name
  local name=$1 cores=$2; shift 3
  # with LOGS, dhtkv logs its flushes and compactions too (level debug)
  [ -n "${LOGS:-}" ] && [ "${1##*/}" = dhtkv ] && set -- "$@" --log-level debug
  local pre=(env)
  [ -n "${GMP:-}" ] && pre+=("GOMAXPROCS=$GMP")
  if [ -n "$CGROOT" ] && mkdir -p "$CGROOT/$name"; then
    # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
    pre+=(bash -c '{ echo $$ >"$0/cgroup.procs"; } 2>/dev/null || echo "pinned.sh: not moved into $0" >&2; exec "$@"' "$CGROOT/$name")
  fi
  if [ -n "${SCHED_SLICE_NS:-}" ] && [ "${1##*/}" = dhtkv ]; then
    # the kernel's time slice of every thread of the node (sched_setattr's
    # sched_runtime, Linux 6.12+; threads inherit it from the one that
    # makes them), set before exec
    pre+=(python3 -c '
import ctypes, os, struct, sys
nr = {"x86_64": 314, "aarch64": 274}[os.uname().machine]
attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 0, 0, 0, 0, int(sys.argv[1]), 0, 0, 0, 0), 56)
if ctypes.CDLL(None, use_errno=True).syscall(nr, 0, attr, 0) != 0:
    sys.exit("pinned.sh: sched_setattr: " + os.strerror(ctypes.get_errno()))
os.execvp(sys.argv[2], sys.argv[2:])' "$SCHED_SLICE_NS")
  fi
  "${pre[@]}" taskset -c "$cores" "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!); printf -v "PID_$name" %s $!
}
load() { # targets workload conns [flags...]: JSON on stdout; the generator's pid in $tmp/load.pid
  local t=$1 w=$2 c=$3; shift 3
  taskset -c $GEN "$B/dhtkv-load" --json --targets "$t" --workload "$w" --keyspace $KS --value-size 1024 \
    --connections "$c" --duration "$DUR" --warmup 1s "$@" 2>/dev/null &
  echo $! >"$tmp/load.pid"
  wait $!
}
# signal_load SIG: open (USR1) or close (USR2) the running load's marked
# window.
source "$ROOT/loadtest/mark.sh"
signal_load() { mark_load "$tmp/load.pid" "$1"; }
fill() { # targets [flags...]
  taskset -c $GEN "$B/dhtkv-load" --targets "$1" --keyspace $KS --value-size 1024 --connections 64 \
    --fill $KS --fill-only "${@:2}" >/dev/null 2>&1
}
# row NAME JSON TICKS: one line: throughput, latency, errors, server CPU per request
row() {
  python3 - "$1" "$2" "$3" "$US_PER_TICK" <<'PY'
import json, sys
name, js, ticks, us_per_tick = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
try:
    d = json.loads(js)
except Exception:
    print(f"{name:40s} NO RESULT {js[:160]!r}"); sys.exit()
l = d.get('latency_us', {})
rps, n = d.get('throughput_rps', 0), max(1, d.get('requests', 0))
errs = sum(d.get('errors', {}).values()) + d.get('non_2xx', 0)
print(f"{name:40s} {rps:9.0f} rps  p50 {l.get('50',0)/1000:7.2f} p99 {l.get('99',0)/1000:8.2f} "
      f"p99.9 {l.get('99.9',0)/1000:8.2f} max {l.get('100',0)/1000:8.1f} ms  err {errs}  cpu {ticks*us_per_tick/n:6.1f} us/req")
for op, l in sorted((d.get('latency_by_op_us') or {}).items()):  # a mix's GETs and PUTs apart
    print(f"{'':42s}{op.upper()}: p50 {l.get('50',0)/1000:.2f} p90 {l.get('90',0)/1000:.2f} p99 {l.get('99',0)/1000:.2f} "
          f"p99.9 {l.get('99.9',0)/1000:.2f} max {l.get('100',0)/1000:.1f} ms")
tl = d.get('timeline') or []
if tl:
    key = lambda s: s.get('p99_us', 0)
    worst = sorted(tl, key=key, reverse=True)[:3]
    print(" " * 42 + "worst seconds (p99 ms): " + ", ".join(
        f"s{s.get('second', '?')}={key(s)/1000:.1f}" for s in worst))
PY
}
run() { # name pids-var target workload conns [flags...]
  local name=$1 ps=$2; shift 2
  local t0 t1 r
  if [ -n "${LOGS:-}" ]; then
    RUNS=$((${RUNS:-0} + 1))
    printf '%s\t%s\t%s\n' "$RUNS" "$(date +%s.%N)" "$name" >>"$tmp/runs.tsv"
  fi
  # The servers' CPU is counted from the end of the load's 1 s warm-up,
  # whose requests are not in its count.
  # shellcheck disable=SC2086 # a list of pids
  (sleep 1; ticks ${!ps} >"$tmp/t0") & local warm=$!
  r=$(load "$@"); t1=$(ticks ${!ps})
  wait $warm; t0=$(cat "$tmp/t0")
  row "$name" "$r" $((t1 - t0))
  [ -n "${LOGS:-}" ] && printf '%s\n' "$r" >"$tmp/run$RUNS.json"
  LAST=$r
}
# hold_profiles ADMIN-PORT TAG DELAY [SECTION]: after DELAY seconds, the
# node's CPU, mutex and block profiles for HOLD_PROFILE seconds into
# {cpu,mutex,block}-SECTION-TAG.pprof (SECTION d by default), from the
# generator's cores; the mutex and block rates are on for that window
# only.
hold_profiles() {
  taskset -c $GEN python3 - "$1" "$2" "$3" "$HOLD_PROFILE" "$tmp" "${4:-d}" <<'PY' || echo "pinned.sh: no profiles of the $2 hold" >&2
import sys, threading, time, urllib.request as u
port, tag, delay, secs, out, section = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
base = f"http://127.0.0.1:{port}/debug/pprof"
time.sleep(delay)
def rates(q):
    u.urlopen(u.Request(f"{base}/rates?{q}", method="POST"), timeout=10).read()
def get(kind, path):
    body = u.urlopen(f"{base}/{path}?seconds={secs}", timeout=secs + 60).read()
    open(f"{out}/{kind}-{section}-{tag}.pprof", "wb").write(body)
rates("mutex=100&block=1000000")
try:
    ts = [threading.Thread(target=get, args=k) for k in (("cpu", "profile"), ("mutex", "mutex"), ("block", "block"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
finally:
    rates("mutex=0&block=0")
PY
}
# sample NAME ADMIN-PORT...: with LOGS, each node's metrics once a second
# into metrics-NAME.tsv (the generator's cores), until the script ends
sample() {
  [ -n "${LOGS:-}" ] || return 0
  local out=$tmp/metrics-$1.tsv; shift
  taskset -c $GEN python3 - "$out" "$@" <<'PY' &
import sys, time, urllib.request
out, ports = sys.argv[1], sys.argv[2:]
names = ["dhtkv_background_pace_factor", "dhtkv_background_pace_sched_latency_p99_seconds",
         "dhtkv_background_pace_cpu_pressure_ratio", "process_cpu_seconds_total",
         "go_gc_pauses_seconds_sum", "go_gc_pauses_seconds_count", "dhtkv_pebble_write_stall_seconds_total",
         "dhtkv_membership_moved_bytes_total", "dhtkv_antientropy_bytes_total",
         "dhtkv_copy_throttled_seconds_total", "dhtkv_clock_bound_writes_total",
         "dhtkv_clock_bound_write_seconds_total", "dhtkv_clock_bound_waits_total",
         "dhtkv_clock_bound_wait_seconds_total", "go_cpu_classes_gc_total_cpu_seconds_total"]
with open(out, "w") as f:
    f.write("time\tport\t" + "\t".join(names) + "\n")
    while True:
        t = time.time()
        for p in ports:
            try:
                m = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=0.5).read().decode()
            except Exception:
                continue
            vals = {}
            for l in m.splitlines():
                n = l.split("{")[0].split(" ")[0]
                if n in names:
                    vals[n] = vals.get(n, 0) + float(l.split()[-1])
            f.write(f"{t:.2f}\t{p}\t" + "\t".join(f"{vals[n]:.6g}" if n in vals else "" for n in names) + "\n")
        f.flush()
        time.sleep(max(0.0, 1 - (time.time() - t)))
PY
  pids+=($!)
}
# fsyncs OUT ADMIN-PORT...: the WAL fsync latency histogram
# (dhtkv_pebble_wal_fsync_seconds) summed over the nodes, into OUT (JSON);
# fsync_report BEFORE AFTER SECONDS prints the fsyncs between the two: how
# many a second, their mean, and the bucket bounds that hold their p50,
# p99 and p99.9 (a replicated PUT waits for its coordinator's fsync and
# one other replica's).
fsyncs() {
  local out=$1; shift
  python3 - "$out" "$@" <<'PY' || echo '{}' >"$out"
import json, sys, urllib.request
out, ports = sys.argv[1], sys.argv[2:]
h = {"sum": 0.0, "count": 0, "le": {}}
for p in ports:
    try:
        m = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=2).read().decode()
    except Exception:
        continue
    for l in m.splitlines():
        if l.startswith("dhtkv_pebble_wal_fsync_seconds_bucket{"):
            le = l.split('le="')[1].split('"')[0]
            h["le"][le] = h["le"].get(le, 0) + float(l.split()[-1])
        elif l.startswith("dhtkv_pebble_wal_fsync_seconds_sum"):
            h["sum"] += float(l.split()[-1])
        elif l.startswith("dhtkv_pebble_wal_fsync_seconds_count"):
            h["count"] += int(float(l.split()[-1]))
json.dump(h, open(out, "w"))
PY
}
fsync_report() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, secs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
n = b.get("count", 0) - a.get("count", 0)
if n <= 0:
    print(f"{'':42s}WAL fsyncs: none counted"); sys.exit()
les = sorted(b["le"], key=lambda x: float("inf") if x == "+Inf" else float(x))
cum = [(le, b["le"][le] - a["le"].get(le, 0)) for le in les]
def q(f):
    for le, c in cum:
        if c >= f * n:
            return "over 6.6 s" if le == "+Inf" else f"<= {float(le) * 1e3:g} ms"
    return "?"
mean = (b["sum"] - a["sum"]) / n * 1e3
print(f"{'':42s}WAL fsyncs of the three nodes: {n / secs:.0f}/s, mean {mean:.2f} ms, p50 {q(0.5)}, p99 {q(0.99)}, p99.9 {q(0.999)}")
PY
}
# cpustat NAME: once a second, each core's jiffies (/proc/stat) and every
# process's CPU ticks with the core it last ran on, into cpustat-NAME.tsv,
# until the script ends (cpu_report reads them over a window).
cpustat() {
  local out=$tmp/cpustat-$1.tsv
  taskset -c $GEN python3 - "$out" <<'PY' &
import os, sys, time
out = sys.argv[1]
with open(out, "w") as f:
    while True:
        t = time.time()
        for l in open("/proc/stat"):
            if l.startswith("cpu") and l[3].isdigit():
                f.write(f"{t:.2f}\tcpu\t{l.split(None, 1)[0][3:]}\t" + "\t".join(l.split()[1:9]) + "\n")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                st = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            comm, rest = st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()
            busy = int(rest[11]) + int(rest[12])
            if busy:  # ppid, utime+stime, the core it last ran on
                f.write(f"{t:.2f}\ttask\t{pid}\t{comm.replace(chr(9), ' ')}\t{rest[1]}\t{busy}\t{rest[36]}\n")
            if comm.startswith("dhtkv"):  # its threads' time runnable but not running (schedstat), ns
                wait = 0
                try:
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        try:
                            wait += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[1])
                        except (OSError, IndexError, ValueError):
                            pass
                except OSError:
                    pass
                f.write(f"{t:.2f}\twait\t{pid}\t{wait}\n")
        f.flush()
        time.sleep(max(0.0, 1 - (time.time() - t)))
PY
  pids+=($!)
}
# cpu_report NAME FROM TO LABEL CORES...: where the cores' time went between
# two times (seconds since the epoch), per group of cores given as
# NAME=LIST (0-5): busy cores (user, system, irq, softirq), iowait, and
# how much of it the servers' processes (dhtkv) and the kernel's threads
# (children of kthreadd) took, and "waiting": the time the servers'
# threads were ready to run but had no core (each thread's schedstat run
# delay, summed: cores' worth of threads queued for a core, which Go's
# scheduler latency does not see); the kernel threads that ran most.
cpu_report() {
  python3 - "$tmp/cpustat-$1.tsv" "$2" "$3" "$4" "${@:5}" <<'PY'
import collections, sys
path, t0, t1, label, groups = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5:]
def cores(spec):
    out = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
cpu, tasks, waits = collections.defaultdict(dict), collections.defaultdict(dict), collections.defaultdict(dict)
for l in open(path):
    r = l.rstrip("\n").split("\t")
    t = float(r[0])
    if r[1] == "cpu":
        cpu[t][int(r[2])] = [int(x) for x in r[3:]]
    elif r[1] == "wait":
        waits[t][r[2]] = int(r[3])
    else:
        tasks[t][r[2]] = (r[3], r[4], int(r[5]), int(r[6]))
ts = [t for t in sorted(cpu) if t0 - 0.5 <= t <= t1 + 0.5]
if len(ts) < 2:
    print(f"{'':42s}{label}: no CPU samples"); sys.exit()
a, b = ts[0], ts[-1]
secs, hz = b - a, 100.0
comm = {}
for t in (a, b):
    for pid, v in tasks.get(t, {}).items():
        comm[pid] = v
def used(pid):  # ticks between a and b
    va, vb = tasks.get(a, {}).get(pid), tasks.get(b, {}).get(pid)
    return (vb[2] if vb else 0) - (va[2] if va else 0) if vb else 0
def waited(pid):  # seconds its threads were runnable but not running, between a and b
    wa, wb = waits.get(a, {}).get(pid), waits.get(b, {}).get(pid)
    return max(0, wb - (wa or 0)) / 1e9 if wb is not None else 0
print(f"{'':42s}{label} ({secs:.0f} s), cores busy (of them irq+softirq) / iowait; servers' and kernel threads' CPU by the core they last ran on, and the servers' threads waiting for a core:")
kthreads = collections.Counter()
for g in groups:
    name, _, spec = g.partition("=")
    cs = cores(spec)
    d = [[cpu[b][c][i] - cpu[a][c][i] for i in range(8)] for c in cs if c in cpu[a] and c in cpu[b]]
    # user nice system idle iowait irq softirq steal
    busy = sum(x[0] + x[1] + x[2] + x[5] + x[6] for x in d) / hz / secs
    irq = sum(x[5] + x[6] for x in d) / hz / secs
    iow = sum(x[4] for x in d) / hz / secs
    srv = sum(used(p) for p, v in comm.items() if v[0].startswith("dhtkv") and int(v[3]) in cs) / hz / secs
    wait = sum(waited(p) for p, v in comm.items() if v[0].startswith("dhtkv") and int(v[3]) in cs) / secs
    kern = 0.0
    for p, v in comm.items():
        if v[1] == "2" and int(v[3]) in cs:
            u = used(p) / hz / secs
            kern += u
            kthreads[v[0]] += u
    print(f"{'':46s}{name} (cores {spec}): busy {busy:.2f} ({irq:.2f}), iowait {iow:.2f}; dhtkv {srv:.2f}, kernel threads {kern:.2f}; waiting {wait:.2f}")
top = ", ".join(f"{n} {u:.2f}" for n, u in kthreads.most_common(5) if u >= 0.005)
print(f"{'':46s}kernel threads that ran most (cores): {top or 'none'}")
PY
}
rps() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('throughput_rps',0))" "$1" 2>/dev/null || echo 0; }

SECTIONS=${SECTIONS:-A B C D}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
if on A; then
echo "## A. one node vs the in-memory baseline, server on 4 cores ($S4), generator on $GEN"
start base4 $S4 19080 "$B/dhtkv-baseline" --listen 127.0.0.1:19080
start node4 $S4 19081 "$DHTKV" --listen 127.0.0.1:19081 --data-dir "$tmp/node4" --cache-bytes 512MiB
start nosync4 $S4 19082 "$DHTKV" --listen 127.0.0.1:19082 --data-dir "$tmp/nosync4" --cache-bytes 512MiB --sync=false
up 19080 19081 19082
for p in 19080 19081 19082; do fill http://127.0.0.1:$p --read-all $KS; done
for c in 64 256; do for w in get put; do
  run "baseline  $w c$c" PID_base4 http://127.0.0.1:19080 $w $c
  run "dhtkv     $w c$c" PID_node4 http://127.0.0.1:19081 $w $c
  [ $w = put ] && run "dhtkv --sync=false $w c$c" PID_nosync4 http://127.0.0.1:19082 $w $c
done; done
kill "$PID_base4" "$PID_node4" "$PID_nosync4"; sleep 0.5
fi

if on B; then

echo "## B. scaling with cores: GET hit and PUT fsync, 256 connections"
for cores in $S1 $S2 $S8; do
  start bs "$cores" 19083 "$B/dhtkv-baseline" --listen 127.0.0.1:19083
  start ns "$cores" 19084 "$DHTKV" --listen 127.0.0.1:19084 --data-dir "$tmp/ns-$cores" --cache-bytes 512MiB
  up 19083 19084
  fill http://127.0.0.1:19083 --read-all $KS; fill http://127.0.0.1:19084 --read-all $KS
  for w in get put; do
    run "baseline cores=$cores $w" PID_bs http://127.0.0.1:19083 $w 256
    run "dhtkv    cores=$cores $w" PID_ns http://127.0.0.1:19084 $w 256
  done
  kill "$PID_bs" "$PID_ns"; sleep 0.5
done
fi

if on C || on D; then

echo "## C. 3 nodes x 2 cores, ack=2 from=3, against one node on 2 cores ($N2), 128 connections"
CL=http://127.0.0.1:19091,http://127.0.0.1:19092,http://127.0.0.1:19093
for i in 1 2 3; do
  c=C$i
  start "c$i" "${!c}" 0 "$DHTKV" --listen 127.0.0.1:1909$i --admin-listen 127.0.0.1:1914$i --data-dir "$tmp/c$i" \
    --cluster $CL --cache-bytes 512MiB
done
start n2 $N2 19094 "$DHTKV" --listen 127.0.0.1:19094 --data-dir "$tmp/n2" --cache-bytes 512MiB
up 19091 19092 19093 19094 19141
sample c 19141 19142 19143
cpustat c
fill $CL --ack 2 --from 3; fill http://127.0.0.1:19094
CPIDS="$PID_c1 $PID_c2 $PID_c3"
declare -A CLOSED
for w in put get; do
  # a PUT invalidates its key's cache entry: read every key on every
  # replica (ack=from=3) and on the node before each GET run
  if [ $w = get ]; then fill $CL --ack 3 --from 3 --read-all $KS; fill http://127.0.0.1:19094 --read-all $KS; fi
  run "node (2 cores) $w" PID_n2 http://127.0.0.1:19094 $w 128
  run "cluster (3x2 cores) $w" CPIDS $CL $w 128 --ack 2 --from 3
  CLOSED[$w]=$(rps "$LAST")
done
# The mix's own closed loop, which point 3 halves: its PUTs empty cache
# entries that its GETs then read from Pebble, so it is below what its
# GETs' and PUTs' closed loops alone would give (printed beside it).
fill $CL --ack 3 --from 3 --read-all $KS
run "cluster (3x2 cores) mixed" CPIDS $CL mixed 128 --ack 2 --from 3
CLOSED[mixed]=$(rps "$LAST")
echo "# the mix's closed loop from its GETs' and PUTs' alone (0.9/get + 0.1/put)^-1: $(python3 -c "print(int(1/(0.9/max(1,${CLOSED[get]})+0.1/max(1,${CLOSED[put]}))))")/s; measured: ${CLOSED[mixed]}/s"

echo "## D. the cluster at half its closed-loop rate for $HOLD, latency from the intended send time"
for w in ${HOLDS:-put get mixed}; do
  [ $w != put ] && fill $CL --ack 3 --from 3 --read-all $KS
  rate=$(python3 -c "print(int(float('${CLOSED[$w]}')/2))")
  h0=$(date +%s.%N)
  fsyncs "$tmp/fsync-$w-0.json" 19141 19142 19143
  profiler=""
  if [ -n "${HOLD_PROFILE:-}" ]; then hold_profiles 19141 $w "$(python3 -c "print(float('${HOLD%s}') / 3)")" & profiler=$!; fi
  DUR=$HOLD run "cluster $w @$rate/s" CPIDS $CL $w 128 --ack 2 --from 3 --rate "$rate" --timeline
  [ -n "$profiler" ] && wait $profiler
  fsyncs "$tmp/fsync-$w-1.json" 19141 19142 19143
  fsync_report "$tmp/fsync-$w-0.json" "$tmp/fsync-$w-1.json" "$(python3 -c "import time; print(time.time() - $h0)")"
  cpu_report c "$h0" "$(date +%s.%N)" "the hold" "nodes=$C1,$C2,$C3" "generator=$GEN"
done
echo "# peak RSS MiB: c1 $(($(awk '/VmHWM/{print $2}' /proc/$PID_c1/status) / 1024))"
kill $CPIDS "$PID_n2"; sleep 0.5
fi

if on E; then
echo "## E. the cluster's PUT tail at one rate for $HOLD, nodes on 2 cores each, GOMAXPROCS in: ${PROCS:-2 8}"
rate=""
for procs in ${PROCS:-2 8}; do
  for i in 1 2 3; do
    c=C$i
    GMP=$procs start "e$i" "${!c}" 0 "$DHTKV" --listen 127.0.0.1:1910$i --data-dir "$tmp/e$procs-$i" \
      --cluster http://127.0.0.1:19101,http://127.0.0.1:19102,http://127.0.0.1:19103 --cache-bytes 512MiB
  done
  EL=http://127.0.0.1:19101,http://127.0.0.1:19102,http://127.0.0.1:19103
  EPIDS="$PID_e1 $PID_e2 $PID_e3"
  up 19101 19102 19103
  fill $EL --ack 2 --from 3
  run "GOMAXPROCS=$procs put closed loop" EPIDS $EL put 128 --ack 2 --from 3
  [ -z "$rate" ] && rate=$(python3 -c "print(int(float('$(rps "$LAST")')/2))")
  DUR=$HOLD run "GOMAXPROCS=$procs put @$rate/s" EPIDS $EL put 128 --ack 2 --from 3 --rate "$rate" --timeline
  kill $EPIDS; sleep 1
done
fi
if on F; then
echo "## F. one core ($S1): GET hit and PUT fsync, 256 connections, dhtkv's GOMAXPROCS in: ${PROCS1:-8 4 2 1 4 8}"
start bf "$S1" 19110 "$B/dhtkv-baseline" --listen 127.0.0.1:19110
up 19110
fill http://127.0.0.1:19110 --read-all $KS
for w in get put; do run "baseline $w" PID_bf http://127.0.0.1:19110 $w 256; done
kill "$PID_bf"; sleep 0.5
n=0
for procs in ${PROCS1:-8 4 2 1 4 8}; do
  n=$((n + 1))
  GMP=$procs start nf "$S1" 19111 "$DHTKV" --listen 127.0.0.1:19111 --data-dir "$tmp/f$n" --cache-bytes 512MiB
  up 19111
  fill http://127.0.0.1:19111 --read-all $KS
  for w in get put; do run "dhtkv GOMAXPROCS=$procs $w" PID_nf http://127.0.0.1:19111 $w 256; done
  kill "$PID_nf"; sleep 0.5
done
fi
if on G; then
# A join of JOIN_N records under a constant 90/10 load, in one run: the
# stream's rate (issue 24: >= 50 MB/s of payload) and the clients' tail
# while it runs (issue 21's: p99 <= 5 ms, p99.9 <= 20 ms), beside the same
# load on the same cluster with no change.
JN=${JOIN_N:-1000000}; JRATE=${JOIN_RATE:-10000}; JMOVE=${JOIN_MOVE_RATE:-64MiB}; JLOAD=${JOIN_LOAD:-60s}
JFLAGS=${JOIN_FLAGS:-}
echo "## G. a join: 3 -> 4 nodes on 2 cores each, $JN records of 1 KiB, --move-rate $JMOVE $JFLAGS, 90/10 GET/PUT at $JRATE/s (ack=2 from=3) for $JLOAD each"
GL=http://127.0.0.1:19121,http://127.0.0.1:19122,http://127.0.0.1:19123
for i in 1 2 3; do
  c=C$i
  start "g$i" "${!c}" 0 "$DHTKV" --listen 127.0.0.1:1912$i --admin-listen 127.0.0.1:1913$i --data-dir "$tmp/g$i" \
    --cluster $GL --cache-bytes 512MiB --move-rate "$JMOVE" $JFLAGS
done
up 19121 19122 19123 19131
sample g 19131 19132 19133 19134
cpustat g
if [ -n "${WRITEBACK_CPUS:-}" ]; then
  mask=$(python3 -c "import sys; print(format(sum(1 << c for p in sys.argv[1].split(',') for c in range(int(p.split('-')[0]), int(p.split('-')[-1]) + 1)), 'x'))" "$WRITEBACK_CPUS")
  for f in /sys/devices/virtual/workqueue/cpumask /sys/bus/workqueue/devices/writeback/cpumask; do
    old=$(cat "$f" 2>/dev/null) || continue
    if echo "$mask" >"$f" 2>/dev/null; then WQ_SAVED[$f]=$old; fi
  done
  echo "kernel's unbound work queues on cores $WRITEBACK_CPUS: $(for f in "${!WQ_SAVED[@]}"; do printf '%s=%s ' "${f#/sys/}" "$(cat "$f")"; done)"
fi
t0=$(date +%s.%N)
taskset -c $GEN "$B/dhtkv-load" --targets $GL --keyspace "$JN" --value-size 1024 --connections 128 \
  --fill "$JN" --fill-only --ack 3 --from 3 >/dev/null 2>&1
echo "filled $JN keys (ack=3) in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
GPIDS="$PID_g1 $PID_g2 $PID_g3"
nc0=$(date +%s.%N)
DUR=$JLOAD run "no change: mixed @$JRATE/s" GPIDS $GL mixed 128 --ack 2 --from 3 --rate "$JRATE" --keyspace "$JN" --timeline
nc1=$(date +%s.%N)
cpu_report g "$nc0" "$nc1" "the load without a change" "old nodes=$C1,$C2,$C3" "node 4=$N2" "generator=$GEN"
# Node 4 starts first (it waits for the join that adds it); the join
# begins 5 s into the load run and dhtkvctl returns when it is over.
g4dir=$tmp/g4
if [ -n "${JOIN_DIR4:-}" ]; then G4DIR=$(mktemp -d "$JOIN_DIR4/pinned-g4.XXXX") && g4dir=$G4DIR && echo "node 4's data directory: $g4dir ($(df -hT "$g4dir" | awk 'NR == 2 {print $2 ", " $5 " free"}'))"; fi
start g4 "$N2" 0 "$DHTKV" --listen 127.0.0.1:19124 --admin-listen 127.0.0.1:19134 --data-dir "$g4dir" \
  --join http://127.0.0.1:19121 --cache-bytes 512MiB --move-rate "$JMOVE" $JFLAGS
# The join is the load's marked window (dhtkv-load: SIGUSR1, SIGUSR2).
(sleep 6; date +%s.%N >"$tmp/join.start"; signal_load USR1
 if [ -n "${JOIN_PROFILE:-}" ]; then
   HOLD_PROFILE=$JOIN_PROFILE hold_profiles 19131 join 3 g &
   (sleep 3; taskset -c $GEN python3 -c 'import sys, urllib.request as u; open(sys.argv[2], "wb").write(u.urlopen(sys.argv[1], timeout=120).read())' \
     "http://127.0.0.1:19134/debug/pprof/profile?seconds=$JOIN_PROFILE" "$tmp/cpu-g4.pprof" || echo "pinned.sh: no profile of node 4" >&2) &
 fi
 "$B/dhtkvctl" join --admin 127.0.0.1:19131 --wait-timeout 30m http://127.0.0.1:19124 >"$tmp/join.out" 2>&1
 signal_load USR2; date +%s.%N >"$tmp/join.end"; wait) &
joiner=$!
GPIDS="$PID_g1 $PID_g2 $PID_g3 $PID_g4"
date +%s.%N >"$tmp/load.start"
DUR=$JLOAD run "during the join: mixed @$JRATE/s" GPIDS $GL mixed 128 --ack 2 --from 3 --rate "$JRATE" --keyspace "$JN" --timeline
wait $joiner
python3 - "$tmp" "$LAST" <<'PY'
import json, re, sys, urllib.request
tmp, js = sys.argv[1], sys.argv[2]
rd = lambda n: open(f"{tmp}/{n}").read().strip()
start, end, load = float(rd("join.start")), float(rd("join.end")), float(rd("load.start"))
print(f"{'':42s}join: {end - start:.1f} s; dhtkvctl: {rd('join.out').splitlines()[-1][:120] if rd('join.out') else ''}")
m = urllib.request.urlopen("http://127.0.0.1:19134/metrics", timeout=10).read().decode()
get = lambda name: sum(float(l.split()[-1]) for l in m.splitlines() if l.split(" ")[0] == name)
moved = get("dhtkv_membership_moved_bytes_total")
print(f"{'':42s}node 4 copied {get('dhtkv_membership_moved_records_total'):.0f} records, {moved / 1e6:.0f} MB: "
      f"{moved / 1e6 / (end - start):.1f} MB/s over the whole change")
for l in open(f"{tmp}/g4.log"):
    if "partitions copied" in l:
        f = dict(re.findall(r'(\w+)=(\S+)', l))
        secs = lambda d: sum(float(v) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}[u] for v, u in re.findall(r'([\d.]+)(ms|h|m|s)', d))
        b, st = float(f.get("streamed_bytes", 0)), secs(f.get("streamed_in", "0s"))
        print(f"{'':42s}stream: {b / 1e6:.0f} MB in {st:.1f} s: {b / 1e6 / max(st, 1e-9):.1f} MB/s; the copy with its comparison {f.get('took')}")
try:  # the pace on each node during the join (LOGS: sampled once a second)
    rows = [l.rstrip("\n").split("\t") for l in open(f"{tmp}/metrics-g.tsv")]
    head, rows = rows[0], [r for r in rows[1:] if start <= float(r[0]) <= end]
    col = lambda r, n: float(r[head.index(n)]) if r[head.index(n)] else None
    for port in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == port]
        def med(n):  # the median of the samples taken (the scheduler's p99: -1 when it had none)
            vs = sorted(v for v in (col(r, n) for r in mine) if v is not None and v >= 0)
            return vs[len(vs) // 2] if vs else float("nan")
        cpu = [col(r, "process_cpu_seconds_total") for r in mine]
        def gc_cores(mine, secs):  # go_cpu_classes_gc_total_cpu_seconds_total's rate (nan: not exported)
            gc = [v for v in (col(r, "go_cpu_classes_gc_total_cpu_seconds_total") for r in mine) if v is not None]
            return (gc[-1] - gc[0]) / max(secs, 1e-9) if len(gc) > 1 else float("nan")
        waited = [col(r, "dhtkv_copy_throttled_seconds_total") or 0 for r in mine]
        secs = float(mine[-1][0]) - float(mine[0][0])
        print(f"{'':42s}node :{port} during the join: pace factor median {med('dhtkv_background_pace_factor'):.3g}, "
              f"sched p99 {med('dhtkv_background_pace_sched_latency_p99_seconds') * 1000:.2f} ms, "
              f"CPU pressure {med('dhtkv_background_pace_cpu_pressure_ratio'):.2f}, "
              f"cores {(cpu[-1] - cpu[0]) / max(secs, 1e-9):.2f} (the collector's, as its Ps counted it, {gc_cores(mine, secs):.2f}), "
              f"its copies waited on its --move-rate {waited[-1] - waited[0]:.1f} s")
except (OSError, IndexError, ValueError, TypeError):
    pass
try:
    d = json.loads(js)
except Exception:
    d = {}
tl = d.get("timeline") or []
mk = d.get("marked")
if mk:
    l = mk.get("latency_us", {})
    span = f"{mk['to_s'] - mk.get('from_s', 0):.1f} s" if 'to_s' in mk else "to the load's end: the join outlasted it"
    print(f"{'':42s}the requests due during the join ({span}): {mk.get('requests')}, "
          f"p50 {l.get('50', 0) / 1000:.2f} p99 {l.get('99', 0) / 1000:.2f} p99.9 {l.get('99.9', 0) / 1000:.2f} "
          f"max {l.get('100', 0) / 1000:.1f} ms, failures {mk.get('failures')}")
    for op, l in sorted((mk.get("latency_by_op_us") or {}).items()):
        print(f"{'':46s}{op.upper()}: p50 {l.get('50', 0) / 1000:.2f} p90 {l.get('90', 0) / 1000:.2f} "
              f"p99 {l.get('99', 0) / 1000:.2f} p99.9 {l.get('99.9', 0) / 1000:.2f} max {l.get('100', 0) / 1000:.1f} ms")
# the load's seconds count from after its 1 s warm-up
inside = [s for s in tl if start <= load + 1 + s.get("second", 0) and load + 2 + s.get("second", 0) <= end + 1]
if inside:
    p = sorted(s.get("p99_us", 0) / 1000 for s in inside)
    print(f"{'':42s}the {len(inside)} seconds of the join: p99 median {p[len(p) // 2]:.1f} ms, worst {p[-1]:.1f} ms, "
          f"max {max(s.get('max_us', 0) for s in inside) / 1000:.1f} ms, failures {sum(s.get('failures', 0) for s in inside)}")
PY
cpu_report g "$(cat "$tmp/join.start")" "$(cat "$tmp/join.end")" "the join" "old nodes=$C1,$C2,$C3" "node 4=$N2" "generator=$GEN"
kill $GPIDS; sleep 0.5
fi
grep -ihE "panic|level=error|write stall|slow disk" "$tmp"/*.log | cut -c1-200 | sort | uniq -c | sort -rn | head -5
echo "# done $(date -u +%FT%TZ)"
