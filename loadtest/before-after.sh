#!/usr/bin/env bash
# What a change costs the request path, measured in ONE run: builds dhtkv
# at REV and from the working tree, starts a 3-node cluster of each
# (ack=2, from=3, --sync=true, load spread over the three nodes), fills
# both, then alternates closed-loop runs of bin/dhtkv-load on the two for
# several rounds (PUT, then GET) and prints median rps, p50 and p99 and the
# after/before ratio. Alternating spreads the shared machine's noise over
# both. Only 127.0.0.1 is contacted.
#
#   loadtest/before-after.sh b3a0aac                  # defaults below
#   ROUNDS=5 DURATION=15s loadtest/before-after.sh HEAD~3
set -euo pipefail
REV=${1:?usage: before-after.sh REV}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
ROUNDS=${ROUNDS:-3}
KEYSPACE=${KEYSPACE:-100000}
VALUE_SIZE=${VALUE_SIZE:-1024}

tmp=$(mktemp -d)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  git -C "$ROOT" worktree remove --force "$tmp/src" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
git -C "$ROOT" worktree add --detach "$tmp/src" "$REV" >/dev/null 2>&1
(cd "$tmp/src" && go build -o "$tmp/before" ./cmd/dhtkv)
(cd "$ROOT" && go build -o "$tmp/after" ./cmd/dhtkv && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)

# before on 1838x, after on 1858x; admin ports +10 (converge.sh uses 1848x).
before=http://127.0.0.1:18381,http://127.0.0.1:18382,http://127.0.0.1:18383
after=http://127.0.0.1:18581,http://127.0.0.1:18582,http://127.0.0.1:18583
for i in 1 2 3; do
  for sys in before after; do
    base=$([ $sys = before ] && echo 1838 || echo 1858)
    list=$([ $sys = before ] && echo "$before" || echo "$after")
    "$tmp/$sys" --listen "127.0.0.1:$base$i" --admin-listen "127.0.0.1:$((base * 10 + i + 10))" \
      --data-dir "$tmp/$sys-$i" --cluster "$list" >"$tmp/$sys-$i.log" 2>&1 &
    pids+=($!)
  done
done
ports="18381 18382 18383 18581 18582 18583"
for port in $ports; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/v0/status" && break; sleep 0.1; done
done

load() { # targets workload [fill]
  "$tmp/dhtkv-load" --json --targets "$1" --workload "$2" --ack 2 --from 3 \
    --keyspace "$KEYSPACE" --value-size "$VALUE_SIZE" --connections "$CONNECTIONS" \
    --duration "$DURATION" --fill "${3:-0}" 2>/dev/null
}
source "$ROOT/loadtest/settle.sh"
load "$before" put "$KEYSPACE" >/dev/null
load "$after" put "$KEYSPACE" >/dev/null
settle $ports

source "$ROOT/loadtest/runs.sh"
echo "# before $(git -C "$ROOT" rev-parse --short "$REV"), after $(git -C "$ROOT" describe --always --dirty); $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), $CONNECTIONS connections, $DURATION per run, $ROUNDS rounds, keyspace $KEYSPACE, values $VALUE_SIZE B"
for r in $(seq "$ROUNDS"); do
  # Alternate which goes first, so neither always runs on a warmer machine.
  order="before after"; [ $((r % 2)) = 0 ] && order="after before"
  for sys in $order; do
    record "$sys-put" "$(load "${!sys}" put)"
    settle $ports
  done
  for sys in $order; do
    record "$sys-get" "$(load "${!sys}" get)"
  done
done
table before before-put after-put before-get after-get
