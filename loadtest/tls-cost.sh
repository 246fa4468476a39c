#!/usr/bin/env bash
# What TLS costs a request: the same dhtkv binary serving plain HTTP and
# TLS (--tls-cert/--tls-key), one node each, under the same closed-loop
# GET load from bin/dhtkv-load (keep-alive connections: the handshakes
# happen in the warm-up, the measured runs pay the record layer only),
# alternating, in ONE run. Prints each run's rps and the server's CPU per
# request (user+system ticks of the node process from /proc/<pid>/stat
# over the run, divided by the requests answered): steadier than rps on
# this shared 2-core machine, where the load generator, which encrypts
# too, shares the cores with the server.
#
#   loadtest/tls-cost.sh
#   ROUNDS=5 DURATION=15s CONNECTIONS=32 loadtest/tls-cost.sh
#
# The certificate is a self-signed ECDSA P-256 one made by the Go
# toolchain's crypto/tls/generate_cert.go (no openssl). Both nodes get a
# read cache that holds every key: GETs are cache hits. Only 127.0.0.1 is
# contacted.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-20000}
VALUE_SIZE=${VALUE_SIZE:-1024}

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
(cd "$tmp" && go run "$(go env GOROOT)/src/crypto/tls/generate_cert.go" \
  --host 127.0.0.1 --ecdsa-curve P256 --ca --duration 24h >/dev/null 2>&1)
chmod 600 "$tmp/key.pem"

cache=$(( KEYSPACE * (VALUE_SIZE + 128) * 2 ))
plain=http://127.0.0.1:18680
tls=https://127.0.0.1:18681
"$tmp/dhtkv" --listen 127.0.0.1:18680 --data-dir "$tmp/plain" --cache-bytes $cache >"$tmp/plain.log" 2>&1 & pids+=($!); plain_pid=$!
"$tmp/dhtkv" --listen 127.0.0.1:18681 --data-dir "$tmp/tls" --cache-bytes $cache \
  --tls-cert "$tmp/cert.pem" --tls-key "$tmp/key.pem" >"$tmp/tls.log" 2>&1 & pids+=($!); tls_pid=$!
for _ in $(seq 100); do
  curl -sf -o /dev/null $plain/v0/status && curl -sf -o /dev/null --cacert "$tmp/cert.pem" $tls/v0/status && break
  sleep 0.1
done

load() { # target extra-flags...
  local target=$1
  shift
  "$tmp/dhtkv-load" --targets "$target" --tls-ca "$tmp/cert.pem" --keyspace "$KEYSPACE" \
    --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" "$@"
}
for target in $plain $tls; do
  load "$target" --fill "$KEYSPACE" --fill-only 2>"$tmp/fill.log" || { cat "$tmp/fill.log" >&2; exit 1; }
  load "$target" --workload get --duration 3s >/dev/null # warm-up: caches, connections, handshakes
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
echo "# $(nproc) cores, $(date -u +%FT%TZ), GET, $CONNECTIONS connections, $VALUE_SIZE-byte values, $DURATION per run"
for r in $(seq "$ROUNDS"); do
  for system in "plain $plain_pid $plain" "tls $tls_pid $tls"; do
    set -- $system
    t0=$(ticks "$2")
    json=$(load "$3" --workload get --duration "$DURATION" --json)
    t1=$(ticks "$2")
    n=$(grep -o '"requests":[0-9]*' <<<"$json" | cut -d: -f2)
    rps=$(grep -o '"throughput_rps":[0-9.]*' <<<"$json" | cut -d: -f2)
    awk -v who="$1" -v r="$r" -v rps="$rps" -v n="$n" -v d="$((t1 - t0))" -v hz="$hz" \
      'BEGIN { printf "round %d %-6s rps %9.0f  cpu %6.2f us/request\n", r, who, rps, d * 1e6 / hz / n }'
  done
done
