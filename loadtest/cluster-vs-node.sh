#!/usr/bin/env bash
# Measures a 3-node cluster (ack=2, from=3, load spread over the three
# nodes) against a single node in ONE run, alternating closed-loop runs of
# bin/dhtkv-load for several rounds, and prints median rps, p50 and p99.
# Both use the default --sync=true. Only 127.0.0.1 is contacted.
#
#   loadtest/cluster-vs-node.sh                  # defaults below
#   ROUNDS=5 DURATION=15s loadtest/cluster-vs-node.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}
SYNC=${SYNC:-true}

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)

node=http://127.0.0.1:18180
cluster=http://127.0.0.1:18181,http://127.0.0.1:18182,http://127.0.0.1:18183
"$tmp/dhtkv" --listen 127.0.0.1:18180 --data-dir "$tmp/node" --sync="$SYNC" >"$tmp/node.log" 2>&1 & pids+=($!)
for i in 1 2 3; do
  "$tmp/dhtkv" --listen 127.0.0.1:1818$i --data-dir "$tmp/c$i" --cluster "$cluster" --sync="$SYNC" >"$tmp/c$i.log" 2>&1 & pids+=($!)
done
for port in 18180 18181 18182 18183; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/v0/status" && break; sleep 0.1; done
done

load() { # targets workload [ack from] [fill]
  "$tmp/dhtkv-load" --json --targets "$1" --workload "$2" --ack "${3:-0}" --from "${4:-0}" \
    --keyspace "$KEYSPACE" --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" \
    --duration "$DURATION" --fill "${5:-0}" 2>/dev/null
}
# Fill both with the whole keyspace (the GETs then all find their key).
load "$node" put 0 0 "$KEYSPACE" >/dev/null
load "$cluster" put 2 3 "$KEYSPACE" >/dev/null

declare -A rps p50 p99
record() { # name json
  echo "$1 $2"
  rps[$1]+="$(jq -r .throughput_rps <<<"$2") "
  p50[$1]+="$(jq -r '.latency_us["50"]' <<<"$2") "
  p99[$1]+="$(jq -r '.latency_us["99"]' <<<"$2") "
}
echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), --sync=$SYNC, $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, values $VALUE_SIZE B"
for r in $(seq "$ROUNDS"); do
  record node-put "$(load "$node" put)"
  record cluster-put "$(load "$cluster" put 2 3)"
  record node-get "$(load "$node" get)"
  record cluster-get "$(load "$cluster" get 2 3)"
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
printf "%-12s %10s %10s %10s %8s\n" run "rps" "p50 µs" "p99 µs" "ratio"
for k in node-put cluster-put node-get cluster-get; do
  base=$(median "${rps[node-${k#*-}]}")
  m=$(median "${rps[$k]}")
  printf "%-12s %10.0f %10s %10s %7.0f%%\n" "$k" "$m" "$(median "${p50[$k]}")" "$(median "${p99[$k]}")" "$(awk -v a="$m" -v b="$base" 'BEGIN{print 100*a/b}')"
done
