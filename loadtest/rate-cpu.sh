#!/usr/bin/env bash
# Server CPU per GET hit at constant rates and at the closed loop, dhtkv
# against dhtkv-baseline: one server on core SERVER_CORE (0), dhtkv-load
# on core LOAD_CORE (1), 64 connections, KEYS (10000) keys of 1 KiB read
# once before, DURATION (10s) a rate. User+system ticks of the server
# (/proc/PID/stat) over a run, divided by the requests answered; also the
# server's CPU while idle. Shows what a request costs a server it finds
# idle (its wake-ups paid alone) against a busy one (docs/benchmarks.md
# section 51). Binaries from BIN (default bin/; `make build`). Only
# 127.0.0.1 is contacted.
#
#   loadtest/rate-cpu.sh
#   RATES="5000 20000 0" loadtest/rate-cpu.sh     # 0: the closed loop
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BIN:-$ROOT/bin}
RATES=${RATES:-5000 20000 0}
KEYS=${KEYS:-10000}
DURATION=${DURATION:-10s}
PORT=${PORT:-18480}
SC=${SERVER_CORE:-0}
LC=${LOAD_CORE:-1}
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
url=http://127.0.0.1:$PORT
measure() { # name cmd...
  local name=$1; shift
  taskset -c "$SC" "$@" >"$tmp/$name.log" 2>&1 & pid=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null "$url/v0/entity?id=x" && break
    sleep 0.1
  done
  taskset -c "$LC" "$B/dhtkv-load" --targets "$url" --workload put --keyspace "$KEYS" --connections 16 \
    --fill "$KEYS" --read-all "$KEYS" --fill-only >/dev/null 2>&1
  local t0 t1
  t0=$(ticks $pid); sleep 5; t1=$(ticks $pid)
  echo "$name idle: $(( (t1 - t0) * 1000 / hz / 5 )) ms of CPU a second"
  for r in $RATES; do
    local extra=() label="closed loop"
    if [ "$r" != 0 ]; then extra=(--rate "$r"); label="@$r/s"; fi
    t0=$(ticks $pid)
    out=$(taskset -c "$LC" "$B/dhtkv-load" --json --targets "$url" --workload get --keyspace "$KEYS" \
      --connections 64 --duration "$DURATION" "${extra[@]}" 2>/dev/null)
    t1=$(ticks $pid)
    python3 -c "
import json, sys
d = json.loads(sys.argv[1]); n = d['requests']
t1, t0, hz = (float(a) for a in sys.argv[4:7])
print(f'{sys.argv[2]:9s} GET {sys.argv[3]:12s} {d[\"throughput_rps\"]:9.0f} rps  cpu {(t1 - t0) / hz * 1e6 / n:6.1f} us/req')
" "$out" "$name" "$label" "$t1" "$t0" "$hz"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
measure baseline "$B/dhtkv-baseline" --listen "127.0.0.1:$PORT"
measure dhtkv "$B/dhtkv" --listen "127.0.0.1:$PORT" --data-dir "$tmp/d" --cache-bytes 256MiB
