#!/usr/bin/env bash
# Range scan figures: bin/dhtkv on 127.0.0.1, filled with bin/dhtkv-load, read with curl.
# usage: loadtest/range-scan.sh single|cluster RECORDS VALUE_SIZE   (from the repository root, after make build)
# Only 127.0.0.1 is contacted.
set -euo pipefail
mode=$1; n=$2; vs=$3
root=/tmp/dhtkv-measure-$mode; rm -rf "$root"; mkdir -p "$root"
ports=(18180 18181 18182)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
nodes=1; [ "$mode" = cluster ] && nodes=3
list=""; for i in $(seq 0 $((nodes-1))); do list+="${list:+,}http://127.0.0.1:${ports[$i]}"; done
for i in $(seq 0 $((nodes-1))); do
  ./bin/dhtkv --listen 127.0.0.1:${ports[$i]} --data-dir "$root/node$i" --sync=false \
    $( [ "$mode" = cluster ] && echo --cluster "$list" ) --log-level warn 2>"$root/node$i.log" &
  pids+=($!)
done
sleep 1
./bin/dhtkv-load --targets http://127.0.0.1:${ports[0]} --workload put --fill "$n" --value-size "$vs" \
  --connections 16 --duration 1s --max-requests 1 --keyspace "$n" >/dev/null
scope=""; [ "$mode" = cluster ] && scope="&scope=cluster"
for fmt in binary chunks; do
  for run in 1 2; do
    rss0=$(awk '/VmRSS/{print $2}' /proc/${pids[0]}/status)
    max=$rss0
    ( while :; do r=$(awk '/VmRSS/{print $2}' /proc/${pids[0]}/status); echo "$r"; sleep 0.05; done ) > "$root/rss" &
    sampler=$!
    out=$(curl -s -o /dev/null -w '%{size_download} %{time_total}' "http://127.0.0.1:${ports[0]}/v0/entities?start=k&format=$fmt$scope")
    kill $sampler; wait $sampler 2>/dev/null || true
    max=$(sort -n "$root/rss" | tail -1)
    read -r bytes secs <<<"$out"
    awk -v b="$bytes" -v s="$secs" -v n="$n" -v f="$fmt" -v r="$run" -v r0="$rss0" -v m="$max" -v mode="$mode" \
      'BEGIN { printf "%s %s run %d: %d records, %.1f MiB body in %.2fs = %.0f MB/s, %.0f records/s; coordinator RSS before %.0f MiB, max during %.0f MiB\n", mode, f, r, n, b/1048576, s, b/1e6/s, n/s, r0/1024, m/1024 }'
  done
done
for i in $(seq 0 $((nodes-1))); do printf 'node%d VmHWM %s\n' $i "$(awk '/VmHWM/{print $2, $3}' /proc/${pids[$i]}/status)"; done
