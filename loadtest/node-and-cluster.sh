# Sourced by syscalls.sh and perf-split.sh (not run): starts one node
# (port 18490) and a 3-node cluster (18491-18493) of $DHTKV (built from the
# tree when unset) with $NODE_FLAGS, fills KEYSPACE keys of 1 KiB into
# each and reads every key on every replica, so that every read cache
# holds every key; defines load TARGETS WORKLOAD ACK FROM [flags...] (a
# closed-loop dhtkv-load over CONNECTIONS connections), $node, $cluster,
# $npid and the cluster's pids in cpids. Everything it started is stopped,
# and its directory removed, when the script exits. Needs ROOT.
CONNECTIONS=${CONNECTIONS:-64}
KEYSPACE=${KEYSPACE:-100000}
NODE_FLAGS=${NODE_FLAGS---cache-bytes 512MiB}

tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$ROOT" && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)
if [ -z "${DHTKV:-}" ]; then (cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv); DHTKV=$tmp/dhtkv; fi
node=http://127.0.0.1:18490
cluster=http://127.0.0.1:18491,http://127.0.0.1:18492,http://127.0.0.1:18493
# shellcheck disable=SC2086 # NODE_FLAGS is a list of flags
"$DHTKV" --listen 127.0.0.1:18490 --data-dir "$tmp/n" $NODE_FLAGS >"$tmp/n.log" 2>&1 &
pids+=($!)
npid=$!
cpids=()
for i in 1 2 3; do
  # shellcheck disable=SC2086
  "$DHTKV" --listen "127.0.0.1:1849$i" --data-dir "$tmp/c$i" --cluster "$cluster" $NODE_FLAGS >"$tmp/c$i.log" 2>&1 &
  pids+=($!)
  cpids+=($!)
done
for p in 0 1 2 3; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:1849$p/v0/status" && break; sleep 0.1; done
done
load() { # targets workload ack from [extra]
  "$tmp/dhtkv-load" --targets "$1" --workload "$2" --ack "$3" --from "$4" --keyspace "$KEYSPACE" \
    --connections "$CONNECTIONS" "${@:5}" 2>/dev/null
}
load $node put 0 0 --fill "$KEYSPACE" --fill-only
load "$cluster" put 2 3 --fill "$KEYSPACE" --fill-only
load $node get 0 0 --read-all "$KEYSPACE" --fill-only
load "$cluster" get 3 3 --read-all "$KEYSPACE" --fill-only
