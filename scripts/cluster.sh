#!/usr/bin/env bash
# The 3-node local cluster of `make run-cluster` (scripts/cluster.sh run)
# and `make stop-cluster` (scripts/cluster.sh stop), and the single node
# of `make run` (scripts/cluster.sh single). make passes its variables
# through the environment:
#
#   PORT        public port of node 1; the nodes listen on PORT, PORT+1 and
#               PORT+2 of 127.0.0.1. Default 8080.
#   ADMIN_PORT  admin port of node 1 (/metrics, pprof, /livez, /readyz,
#               /repair); the nodes use ADMIN_PORT..ADMIN_PORT+2. Default
#               PORT-2020, i.e. 6060 for 8080 and 21060 for 23080.
#   DATA        directory holding node{1,2,3}/ (Pebble), node{1,2,3}.log
#               and node{1,2,3}.pid, and single/, the single node's data.
#               Default ./data for PORT 8080 and ./data/PORT for any other:
#               a node refuses a directory of a cluster with other URLs, so
#               each base port has its own.
#   BIN         directory of the dhtkv binary. Default ./bin.
#
# run starts the nodes in the background, waits until each answers
# /v0/status, prints the URLs it started them on, and stays until Ctrl-C,
# SIGTERM or `stop` (which stop all three), or until a node exits. It
# refuses to start when one of the six ports is already taken, rather than
# report a cluster that is someone else's. stop sends SIGTERM to the
# nodes of DATA's pid files and waits for them to exit. single runs one
# node in the foreground, on PORT and ADMIN_PORT with its data in
# DATA/single: a directory of its own, never one of the cluster's (a
# cluster node started alone waits for its two peers and answers 504).
set -euo pipefail

PORT=${PORT:-8080}
BIN=${BIN:-bin}
HOST=127.0.0.1

die() { echo "cluster.sh: $*" >&2; exit 1; }

# check_port NAME VALUE: a base of three consecutive unprivileged ports.
check_port() {
  [[ $2 =~ ^[0-9]{1,5}$ ]] || die "$1=$2 is not a port number"
  (($2 >= 1024 && $2 + 2 <= 65535)) || die "$1=$2: want 1024 to 65533 (the base of three consecutive ports)"
}
check_port PORT "$PORT"
if [[ -z ${ADMIN_PORT:-} ]]; then
  ADMIN_PORT=$((PORT - 2020))
  ((ADMIN_PORT >= 1024)) || die "ADMIN_PORT (PORT-2020 by default) would be $ADMIN_PORT: set ADMIN_PORT"
fi
check_port ADMIN_PORT "$ADMIN_PORT"
((ADMIN_PORT + 2 < PORT || ADMIN_PORT > PORT + 2)) || die "ADMIN_PORT=$ADMIN_PORT overlaps PORT=$PORT..$((PORT + 2))"
if [[ -z ${DATA:-} ]]; then
  DATA=data
  ((PORT == 8080)) || DATA=data/$PORT
fi

# in_use PORT: something accepts connections on it.
in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

run() {
  local i port admin cluster="" pids=()
  for i in 0 1 2; do
    cluster+="${cluster:+,}http://$HOST:$((PORT + i))"
  done
  for port in $(seq "$PORT" $((PORT + 2))) $(seq "$ADMIN_PORT" $((ADMIN_PORT + 2))); do
    in_use "$port" && die "port $port is in use (another cluster? try make run-cluster PORT=<another base>, or make stop-cluster PORT=$PORT)"
  done
  [[ -x $BIN/dhtkv ]] || die "$BIN/dhtkv not found (make build)"
  mkdir -p "$DATA"
  stop_all() {
    trap - INT TERM EXIT
    echo
    echo "stopping cluster"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait || true
    rm -f "$DATA"/node{1,2,3}.pid
  }
  trap stop_all EXIT
  trap 'stop_all; exit 0' INT TERM # a requested stop is a success
  for i in 1 2 3; do
    "$BIN/dhtkv" --listen "$HOST:$((PORT + i - 1))" --admin-listen "$HOST:$((ADMIN_PORT + i - 1))" \
      --data-dir "$DATA/node$i" --cluster "$cluster" >>"$DATA/node$i.log" 2>&1 &
    pids+=($!)
    echo $! >"$DATA/node$i.pid"
  done
  local left=() code
  for i in 1 2 3; do
    port=$((PORT + i - 1))
    for _ in $(seq 100); do
      if ! kill -0 "${pids[i - 1]}" 2>/dev/null; then
        code=0
        wait "${pids[i - 1]}" || code=$?
        # A node decommissioned earlier exits 0 on its directory
        # (membership.ErrLeft): the others are the cluster now.
        if ((code == 0)) && grep -q "decommissioned" <(tail -n 3 "$DATA/node$i.log"); then
          echo "node$i was decommissioned earlier (see $DATA/node$i.log); the others go on without it"
          left+=("$i")
          continue 2
        fi
        die "node$i exited at start; the end of $DATA/node$i.log: $(tail -n 3 "$DATA/node$i.log")"
      fi
      curl -sf -o /dev/null "http://$HOST:$port/v0/status" && continue 2
      sleep 0.1
    done
    die "node$i does not answer on http://$HOST:$port after 10 s (see $DATA/node$i.log)"
  done
  for i in "${left[@]}"; do
    pids[i - 1]="" # its position stays: node i is pids[i - 1]
    rm -f "$DATA/node$i.pid"
  done
  echo "dhtkv cluster running:"
  for i in 1 2 3; do
    port=$((PORT + i - 1)) admin=$((ADMIN_PORT + i - 1))
    echo "  node$i  http://$HOST:$port  admin http://$HOST:$admin/metrics  log $DATA/node$i.log"
  done
  echo
  echo "try:  curl -X PUT --data-binary hello 'http://$HOST:$PORT/v0/entity?id=greeting'"
  echo "      bin/dhtkvctl --endpoints $cluster get greeting"
  echo "Ctrl-C (or make stop-cluster PORT=$PORT) stops all three."
  # A node decommissioned (dhtkvctl decommission, docs/membership.md)
  # exits 0 by itself: the others go on. Any other exit stops them all.
  local live exited code
  read -ra live <<<"${pids[*]}" # the nodes running
  while ((${#live[@]} > 0)); do
    code=0
    wait -n -p exited "${live[@]}" || code=$?
    for i in 1 2 3; do
      [[ ${pids[i - 1]} == "$exited" ]] || continue
      if ((code == 0)) && grep -q "decommissioned" <(tail -n 3 "$DATA/node$i.log"); then
        echo "node$i was decommissioned and stopped; the others go on"
        live=("${live[@]/$exited/}")
        read -ra live <<<"${live[*]}"
        continue 2
      fi
    done
    echo "a node exited (make stop-cluster, or see $DATA/node*.log)"
    return
  done
}

stop() {
  local f pid pids=()
  for f in "$DATA"/node{1,2,3}.pid; do
    [[ -f $f ]] || continue
    pid=$(<"$f")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  if ((${#pids[@]} == 0)); then
    echo "no cluster running from $DATA (PORT=$PORT)"
    return
  fi
  # The nodes finish their requests and close Pebble (--shutdown-timeout,
  # 10 s by default); wait for that, so that the data directories are free
  # when this returns.
  for _ in $(seq 150); do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && { sleep 0.1; continue 2; }
    done
    echo "stopped (PORT=$PORT, data in $DATA)"
    return
  done
  die "nodes ${pids[*]} still running after 15 s"
}

# single: one node, in the foreground (Ctrl-C stops it); its own messages
# on stderr.
single() {
  [[ -x $BIN/dhtkv ]] || die "$BIN/dhtkv not found (make build)"
  mkdir -p "$DATA"
  echo "dhtkv node on http://$HOST:$PORT, admin http://$HOST:$ADMIN_PORT/metrics, data in $DATA/single"
  exec "$BIN/dhtkv" --listen "$HOST:$PORT" --admin-listen "$HOST:$ADMIN_PORT" --data-dir "$DATA/single"
}

case ${1:-} in
run) run ;;
stop) stop ;;
single) single ;;
*) die "usage: [PORT=8080] [ADMIN_PORT=PORT-2020] [DATA=dir] [BIN=bin] scripts/cluster.sh run|stop|single" ;;
esac
