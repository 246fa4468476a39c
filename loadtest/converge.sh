#!/usr/bin/env bash
# How fast a replica that was down converges, per mechanism, with the real
# binaries. For each mode, on a fresh 3-node cluster (--sync=true):
#
#   1. start nodes 1-3, stop node 3 with SIGTERM;
#   2. write N keys k0..k<N-1> (bin/dhtkv-load --fill, ack=2 from=3,
#      through nodes 1 and 2): node 3 misses every one of them;
#   3. restart node 3 and let one mechanism repair it:
#      hints       defaults (hinted handoff on, --read-repair=blocking), no
#                  client reads: the time until nodes 1 and 2 have no hint
#                  bytes pending for node 3 (dhtkv_hints_pending_bytes);
#      reads       --hint-window=1ms (every hint dropped before node 3 is
#                  back) and --read-repair=blocking: one GET of every key,
#                  ack=3 from=3, through node 1;
#      reads-ack2  the same with ack=2 from=3: a quorum read that does not
#                  ask node 3 cannot repair it;
#      ae          --hint-window=1ms --read-repair=off, no client reads:
#                  POST /repair on node 3's admin port (an anti-entropy
#                  exchange with nodes 1 and 2), timed until it answers;
#      none        --hint-window=1ms --read-repair=off, then the ack=3 pass
#                  of reads: the control, nothing may repair node 3;
#      Every mode runs with --ae-interval=0, so that no scheduled
#      anti-entropy exchange repairs what another mechanism is measured on.
#   4. count the keys node 3 holds: its local range scan
#      (/v0/entities?start=k&end=l&format=binary, record count from the
#      stream's end marker), then, after stopping nodes 1 and 2, a GET
#      ack=1 from=3 of every key through node 3 (only node 3 can answer:
#      200 = it holds the key, 404 = it does not).
#
# "converge s" is measured from node 3's restart (the process start) to the
# end of the mechanism (hints: last pending byte gone, polled every 0.1 s;
# reads: last GET answered), so it includes node 3's start-up; the detail
# lines give the start-up and the read pass alone. The read passes and the
# counts use curl with READERS transfers in parallel, each key once.
# Only 127.0.0.1 is contacted; every wait is bounded by WAIT_S seconds.
#
#   loadtest/converge.sh                         # N=10000 VALUE_SIZE=1024, all modes
#   N=5000 MODES="hints none" loadtest/converge.sh
#   N=100000 MODES=hints NODE_FLAGS=--hint-replay-rate=67108864 loadtest/converge.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-10000}
VALUE_SIZE=${VALUE_SIZE:-1024}
MODES=${MODES:-hints reads reads-ack2 ae none}
CONNECTIONS=${CONNECTIONS:-16} # dhtkv-load workers for the fill
READERS=${READERS:-8}          # curl transfers in parallel for read passes and counts
WAIT_S=${WAIT_S:-300}          # bound on every wait
NODE_FLAGS=${NODE_FLAGS:-}     # extra flags for every node, e.g. --hint-replay-rate=67108864
read -ra node_flags <<<"$NODE_FLAGS"

tmp=$(mktemp -d)
declare -A pid=()
cleanup() {
  local p
  for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
(cd "$ROOT" && go build -o "$tmp/dhtkv" ./cmd/dhtkv && go build -o "$tmp/dhtkv-load" ./cmd/dhtkv-load)

# Nodes on 18481-18483, admin (/metrics) on 18491-18493: no other script uses 184xx.
port() { echo $((18480 + $1)); }
admin() { echo $((18490 + $1)); }
url() { echo "http://127.0.0.1:$(port "$1")"; }
cluster="$(url 1),$(url 2),$(url 3)"
node3=$(url 3) # the peer label of node 3 in nodes 1 and 2's metrics

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}'; }

start_node() { # i dir flags...
  local i=$1 dir=$2
  shift 2
  "$tmp/dhtkv" --listen "127.0.0.1:$(port "$i")" --admin-listen "127.0.0.1:$(admin "$i")" \
    --data-dir "$dir/node$i" --cluster "$cluster" --sync=true "${node_flags[@]}" "$@" >>"$dir/node$i.log" 2>&1 &
  pid[$i]=$!
}
wait_up() { # i
  local end=$((SECONDS + WAIT_S))
  until curl -sf -m 1 -o /dev/null "$(url "$1")/v0/status"; do
    ((SECONDS < end)) || { echo "node $1 did not come up in ${WAIT_S}s" >&2; exit 1; }
    kill -0 "${pid[$1]}" 2>/dev/null || { echo "node $1 exited" >&2; exit 1; }
    sleep 0.05
  done
}
stop_node() { # i: SIGTERM, wait for the exit (the node's own --shutdown-timeout is 10 s)
  local p=${pid[$1]} end=$((SECONDS + 30))
  kill -TERM "$p"
  while kill -0 "$p" 2>/dev/null; do
    ((SECONDS < end)) || { kill -KILL "$p" 2>/dev/null || true; break; }
    sleep 0.05
  done
  wait "$p" 2>/dev/null || true
  unset "pid[$1]"
}

metric() { # name label-filter node... -> the samples summed (awk regex on the labels)
  local name=$1 filter=$2 i
  shift 2
  for i in "$@"; do curl -s -m 5 "http://127.0.0.1:$(admin "$i")/metrics"; done |
    awk -v n="$name" -v f="$filter" '
      index($1, n) == 1 && (substr($1, length(n) + 1, 1) == "{" || $1 == n) && $1 ~ f {s += $2}
      END {printf "%.0f", s}'
}
pending() { metric dhtkv_hints_pending_bytes "peer=\"$node3\"" 1 2; }

# One GET of every key k0..k<N-1> through node $1 with ack=$2 from=$3;
# prints the status codes counted ("200:9999 504:1").
pass() { # node ack from
  seq 0 $((N - 1)) | awk -v u="$(url "$1")" -v q="&ack=$2&from=$3" \
    '{printf "url = \"%s/v0/entity?id=k%d%s\"\noutput = \"/dev/null\"\n", u, $1, q}' >"$tmp/urls"
  { curl -s --no-progress-meter -Z --parallel-max "$READERS" -m 10 -K "$tmp/urls" -w '%{http_code}\n' || true; } |
    sort | uniq -c | awk '{printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1}'
}
# Records node $1 holds of k*, from its local (not cluster) range scan.
localcount() { # node
  curl -sf -m 60 -o "$tmp/scan" "$(url "$1")/v0/entities?start=k&end=l&format=binary" || { echo "scan-failed"; return; }
  # The stream ends with 0x00 and the record count as a uvarint.
  tail -c 16 "$tmp/scan" | od -An -v -tu1 | awk '
    {for (i = 1; i <= NF; i++) b[n++] = $i}
    END {
      j = n - 1
      while (j > 0 && b[j - 1] >= 128) j--
      if (j < 1 || b[j - 1] != 0 || b[n - 1] >= 128) {print "bad-stream"; exit}
      c = 0; m = 1
      for (k = j; k < n; k++) {c += (b[k] % 128) * m; m *= 128}
      print c
    }'
}
codes() { # "200:5 404:3" code -> count
  tr ' ' '\n' <<<"$1" | awk -F: -v c="$2" '$1 == c {print $2; f = 1} END {if (!f) print 0}'
}

declare -A row=()
run_mode() { # mode
  local mode=$1 dir=$tmp/$1 flags=() ack=0 t0 t_up t_pass="" converge="" res i
  mkdir -p "$dir"
  case $mode in
  hints) ;;
  reads) flags=(--hint-window=1ms --read-repair=blocking) ack=3 ;;
  reads-ack2) flags=(--hint-window=1ms --read-repair=blocking) ack=2 ;;
  ae) flags=(--hint-window=1ms --read-repair=off) ;;
  none) flags=(--hint-window=1ms --read-repair=off) ack=3 ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  flags+=(--ae-interval=0)
  for i in 1 2 3; do start_node "$i" "$dir" "${flags[@]}"; done
  for i in 1 2 3; do wait_up "$i"; done
  stop_node 3

  "$tmp/dhtkv-load" --targets "$(url 1),$(url 2)" --fill "$N" --fill-only --keyspace "$N" \
    --value-size "$VALUE_SIZE" --ack 2 --from 3 --connections "$CONNECTIONS" 2>"$dir/fill.log" ||
    { cat "$dir/fill.log" >&2; exit 1; }
  local stored
  stored=$(metric dhtkv_hints_stored_total "peer=\"$node3\"" 1 2)
  if [ "$mode" != hints ]; then # wait until the 1 ms window dropped every hint (the loop runs every second)
    local end=$((SECONDS + WAIT_S))
    while [ "$(pending)" != 0 ] && ((SECONDS < end)); do sleep 0.1; done
  fi
  local pend0
  pend0=$(pending)

  t0=$(now)
  start_node 3 "$dir" "${flags[@]}"
  wait_up 3
  t_up=$(since "$t0")
  if [ "$mode" = hints ]; then
    local end=$((SECONDS + WAIT_S))
    while [ "$(pending)" != 0 ]; do
      ((SECONDS < end)) || break
      sleep 0.1
    done
    [ "$(pending)" = 0 ] && converge=$(since "$t0")
  elif [ "$mode" = ae ]; then
    local tp
    tp=$(now)
    res=$(curl -s -m "$WAIT_S" -X POST "http://127.0.0.1:$(admin 3)/repair" | jq -c '[.[] | {pulled, pushed, partitions_differing, summary_bytes, record_bytes, error}]')
    t_pass=$(since "$tp")
    converge=$(since "$t0")
  else
    local tp
    tp=$(now)
    res=$(pass 1 "$ack" 3)
    t_pass=$(since "$tp")
    converge=$(since "$t0")
    sleep 1 # repairs to replicas not waited for finish in the background within --replica-timeout
  fi

  local scan replayed dropped repairs rfailed hedged
  scan=$(localcount 3)
  hedged=$(metric dhtkv_coordinator_hedged_reads_total '' 1)
  replayed=$(metric dhtkv_hints_replayed_total "peer=\"$node3\"" 1 2)
  dropped=$(metric dhtkv_hints_dropped_total "peer=\"$node3\"" 1 2)
  repairs=$(metric dhtkv_read_repairs_total 'result="ok"' 1 2 3)
  rfailed=$(metric dhtkv_read_repairs_total 'result="(failed|dropped)"' 1 2 3)
  stop_node 1
  stop_node 2
  local count
  count=$(pass 3 1 3)
  stop_node 3

  local held
  held=$(codes "$count" 200)
  if [ "$mode" = hints ]; then
    converge=${converge:-"not within ${WAIT_S}s"}
    [ "$held" = "$N" ] || converge="$converge (but node 3 holds $held of $N keys)"
  elif [ "$held" != "$N" ]; then
    converge="— (not converged; the pass took ${t_pass} s)"
  fi
  row[$mode]=$(printf '| %s | %d | %s | %s | %s | %s | %s |' "$mode" "$N" "$converge" "$held" "$replayed" "$dropped" "$repairs")
  {
    printf '# %s: hints stored for node 3 %s, pending at restart %s B; node 3 serving %s s after restart' \
      "$mode" "$stored" "$pend0" "$t_up"
    if [ "$mode" = ae ]; then
      printf '; POST /repair on node 3: %s s, %s' "$t_pass" "$res"
    elif [ -n "$t_pass" ]; then
      printf '; read pass ack=%s from=3 via node 1: %s s, %s, %s hedged' "$ack" "$t_pass" "$res" "$hedged"
    fi
    printf '\n#   node 3 afterwards: local scan %s records; GET ack=1 from=3 via node 3 alone: %s; read repairs failed or dropped: %s\n' \
      "$scan" "$count" "$rfailed"
  }
}

echo "# $(nproc) cores, $(go version | cut -d' ' -f3), $(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?), N=$N, values $VALUE_SIZE B, --sync=true${NODE_FLAGS:+ $NODE_FLAGS}, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for mode in $MODES; do run_mode "$mode"; done
echo
echo "| mode | N | converge s | keys on node 3 after | hints replayed | hints dropped | read repairs (ok) |"
echo "|---|---|---|---|---|---|---|"
for mode in $MODES; do echo "${row[$mode]}"; done
