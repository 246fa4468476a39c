#!/usr/bin/env bash
# The local cluster of `make run-cluster` (scripts/cluster.sh run), `make
# stop-cluster` (stop), `make run-node N=…` and `make stop-node N=…`
# (node N, stop-node N), and the single node of `make run` (single). make
# passes its variables through the environment:
#
#   PORT        public port of node 1; node N listens on PORT+N-1 of
#               127.0.0.1 (8080, 8081, 8082 for the three first).
#               Default 8080.
#   ADMIN_PORT  admin port of node 1 (/metrics, pprof, /livez, /readyz,
#               /repair); node N uses ADMIN_PORT+N-1. Default: the one
#               DATA's cluster was last started with (DATA/admin-port),
#               else PORT-2020, i.e. 6060 for 8080 and 21060 for 23080.
#   DATA        directory holding nodeN/ (Pebble), nodeN.log and nodeN.pid
#               for every node, and single/, the single node's data.
#               Default ./data for PORT 8080 and ./data/PORT for any other:
#               a node refuses a directory of a cluster with other URLs, so
#               each base port has its own.
#   BIN         directory of the dhtkv binary. Default ./bin.
#   BALLAST     each local node's --ballast-size (docs/storage.md), the
#               single node's too. Default 64MiB.
#
# The cluster is what its nodes' directories hold. run starts nodes 1-3
# (seeded from their list at the first start) and every further nodeN/ in
# DATA (nodes that joined, or took a dead node's place, with `make
# run-node`): each starts on its stored cluster map. A node the map no
# longer holds (decommissioned, removed or replaced) exits 0 saying so, and the
# others go on without it. run waits until each node answers /v0/status,
# prints the URLs, and stays until Ctrl-C, SIGTERM or `stop` (which stop
# every node of DATA), or until no node of DATA runs: a node that exits,
# is stopped alone or dies is told, and the others go on. It refuses to
# start when one of the nodes' ports is already taken, rather than report
# a cluster that is someone else's. node N starts node N in the
# background (a new one takes the map from a running member: add it
# first with dhtkvctl join or replace) and returns once it answers;
# stop-node N stops it; stop stops every node with a pid file in DATA and
# waits for them to exit. single runs one node in the foreground, on PORT
# and ADMIN_PORT with its data in DATA/single: a directory of its own,
# never one of the cluster's (a cluster node started alone waits for its
# two peers and answers 504).
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
default_data=data
((PORT == 8080)) || default_data=data/$PORT
DATA=${DATA:-$default_data}
# same: the make variables, each with a space before it, that name this
# cluster again in a hint (none for the default cluster).
same=""
((PORT == 8080)) || same+=" PORT=$PORT"
[[ $DATA == "$default_data" ]] || same+=" DATA=$DATA"
# The cluster's admin base port is remembered in DATA with its PORT (run
# and node write both), so that make run-node N=… and a later make
# run-cluster of the same cluster use the ADMIN_PORT it was started with,
# not the default.
if [[ -z ${ADMIN_PORT:-} && -f $DATA/admin-port && ${1:-} != single ]]; then
  read -r remembered_port remembered_admin <"$DATA/admin-port" || true
  if [[ ${remembered_port:-} == "$PORT" && -n ${remembered_admin:-} ]]; then
    ADMIN_PORT=$remembered_admin
  fi
fi
if [[ -z ${ADMIN_PORT:-} ]]; then
  ADMIN_PORT=$((PORT - 2020))
  ((ADMIN_PORT >= 1024)) || die "ADMIN_PORT (PORT-2020 by default) would be $ADMIN_PORT: set ADMIN_PORT"
fi
check_port ADMIN_PORT "$ADMIN_PORT"
((ADMIN_PORT + 2 < PORT || ADMIN_PORT > PORT + 2)) || die "ADMIN_PORT=$ADMIN_PORT overlaps PORT=$PORT..$((PORT + 2))"

# in_use PORT: something accepts connections on it.
in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

url_of() { echo "http://$HOST:$((PORT + $1 - 1))"; }

# members: 1 2 3 and every further N with a DATA/nodeN directory, in order.
members() {
  local d n
  {
    printf '%s\n' 1 2 3
    for d in "$DATA"/node*/; do
      n=${d%/}
      n=${n##*/node}
      [[ $n =~ ^[0-9]+$ ]] && ((n > 3)) && echo "$n"
    done
  } | sort -nu
}

# launch N [flags...]: node N in the background, its pid in DATA/nodeN.pid.
launch() {
  local i=$1
  shift
  # A local cluster's nodes share one disk: a 64 MiB emergency ballast
  # each (BALLAST=), not the production default of 1% of the volume (up
  # to 1 GiB each).
  "$BIN/dhtkv" --listen "$HOST:$((PORT + i - 1))" --admin-listen "$HOST:$((ADMIN_PORT + i - 1))" \
    --data-dir "$DATA/node$i" --ballast-size "${BALLAST:-64MiB}" "$@" >>"$DATA/node$i.log" 2>&1 &
  echo $! >"$DATA/node$i.pid"
  LAUNCHED=$!
}

# left N CODE: node N exited with CODE because the cluster map no longer
# holds it (membership.ErrLeft, or a newer map without it): exit 0 and the
# word in its log's last lines.
left() { (($2 == 0)) && grep -qE "decommissioned|left the cluster" <(tail -n 50 "$DATA/node$1.log"); }

# await N PID: node N answers /v0/status (0), left the cluster (1); dies
# when it exited otherwise or does not answer in 30 s. Each probe is
# bounded (curl -m): a node started with --join before dhtkvctl join
# added it has its listener bound but serves nothing until then, for up
# to --join-wait (10 min), and an unbounded curl waited all that time.
await() {
  local code end=$((SECONDS + 30))
  while ((SECONDS < end)); do
    if ! kill -0 "$2" 2>/dev/null; then
      code=0
      wait "$2" 2>/dev/null || code=$?
      rm -f "$DATA/node$1.pid"
      left "$1" "$code" && return 1
      die "node$1 exited at start; the end of $DATA/node$1.log: $(tail -n 3 "$DATA/node$1.log")"
    fi
    curl -sf -m 2 -o /dev/null "$(url_of "$1")/v0/status" && return 0
    sleep 0.1
  done
  if grep -q "waiting to be added to the cluster" <(tail -n 20 "$DATA/node$1.log"); then
    die "node$1 waits to be added to the cluster (for --join-wait, 10 min by default): add it with bin/dhtkvctl join --admin <a member's admin address> $(url_of "$1"), or stop it with make stop-node N=$1$same"
  fi
  die "node$1 does not answer on $(url_of "$1") after 30 s; it still runs (make stop-node N=$1$same stops it; see $DATA/node$1.log)"
}

run() {
  local i port cluster="" nodes=() started=() pids=()
  read -ra nodes <<<"$(members | tr '\n' ' ')"
  for i in 1 2 3; do
    cluster+="${cluster:+,}$(url_of "$i")"
  done
  for i in "${nodes[@]}"; do
    for port in $((PORT + i - 1)) $((ADMIN_PORT + i - 1)); do
      ((port <= 65535)) || die "node$i's port $port is out of range"
      in_use "$port" && die "port $port is in use (another cluster? try make run-cluster PORT=<another base>, or make stop-cluster$same)"
    done
  done
  [[ -x $BIN/dhtkv ]] || die "$BIN/dhtkv not found (make build)"
  mkdir -p "$DATA"
  echo "$PORT $ADMIN_PORT" >"$DATA/admin-port"
  stop_all() {
    trap - INT TERM EXIT
    echo
    echo "stopping cluster"
    stop >/dev/null
  }
  trap stop_all EXIT
  trap 'stop_all; exit 0' INT TERM # a requested stop is a success
  for i in "${nodes[@]}"; do
    if ((i <= 3)); then
      launch "$i" --cluster "$cluster"
    else
      launch "$i" # on its stored map
    fi
    pids[i]=$LAUNCHED
  done
  for i in "${nodes[@]}"; do
    if await "$i" "${pids[i]}"; then
      started+=("$i")
    else
      # Decommissioned or replaced earlier (membership.ErrLeft, or a
      # newer map without it): the others are the cluster now.
      echo "node$i was decommissioned, removed or replaced earlier (see $DATA/node$i.log); the others go on without it"
      unset "pids[i]"
    fi
  done
  ((${#started[@]} > 0)) || die "no node of $DATA is a member any more"
  echo "dhtkv cluster running:"
  for i in "${started[@]}"; do
    echo "  node$i  $(url_of "$i")  admin http://$HOST:$((ADMIN_PORT + i - 1))/metrics  log $DATA/node$i.log"
  done
  echo
  echo "try:  curl -X PUT --data-binary hello 'http://$HOST:$((PORT + started[0] - 1))/v0/entity?id=greeting'"
  echo "      bin/dhtkvctl --endpoints $(for i in "${started[@]}"; do printf '%s,' "$(url_of "$i")"; done | sed 's/,$//') get greeting"
  echo "Ctrl-C (or make stop-cluster$same) stops every node."
  # Each node's exit is told as it happens, and the others go on: a node
  # decommissioned or removed (dhtkvctl decommission or remove,
  # docs/membership.md) exits 0 by itself; one stopped with make
  # stop-node, or that died, is started again with make run-node (which
  # writes its new pid file). run stays while any node of DATA runs, the
  # ones run-node started included; it exits 1 when the last one it saw
  # end had died, 0 when it was stopped or left.
  local pid code died=0 f
  while :; do
    for i in "${!pids[@]}"; do
      pid=${pids[i]}
      kill -0 "$pid" 2>/dev/null && continue
      code=0
      wait "$pid" 2>/dev/null || code=$?
      unset "pids[i]"
      died=0
      if [[ $(cat "$DATA/node$i.pid" 2>/dev/null) != "$pid" ]]; then
        echo "node$i stopped (make stop-node N=$i$same or stop-cluster$same; make run-node N=$i$same starts it again)"
        continue
      fi
      rm -f "$DATA/node$i.pid"
      if left "$i" "$code"; then
        echo "node$i left the cluster (decommissioned or removed) and stopped; the others go on"
        continue
      fi
      died=1
      echo "node$i exited (status $code); the end of $DATA/node$i.log:"
      tail -n 3 "$DATA/node$i.log" | sed 's/^/  /'
      echo "the others go on (make run-node N=$i$same starts it again)"
    done
    for f in "$DATA"/node*.pid; do
      pid=$(cat "$f" 2>/dev/null) && kill -0 "$pid" 2>/dev/null && { sleep 0.5; continue 2; }
    done
    echo "no node of $DATA runs any more"
    return "$died"
  done
}

# node N: start node N in the background and return once it answers. A
# node with a directory starts on its stored map; a new one takes the map
# from the first running member of DATA (JOIN= names another).
node() {
  local i=${1:-} join=${JOIN:-} f m pid
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1)) || die "node: want N, a node number (1, 2, ...): make run-node N=4"
  [[ -x $BIN/dhtkv ]] || die "$BIN/dhtkv not found (make build)"
  for port in $((PORT + i - 1)) $((ADMIN_PORT + i - 1)); do
    ((port <= 65535)) || die "node$i's port $port is out of range"
    in_use "$port" && die "port $port is in use (node$i already running? make stop-node N=$i$same)"
  done
  mkdir -p "$DATA"
  echo "$PORT $ADMIN_PORT" >"$DATA/admin-port"
  local flags=()
  if [[ ! -d $DATA/node$i ]] || [[ -z $(ls -A "$DATA/node$i") ]]; then
    if [[ -z $join ]]; then
      for f in "$DATA"/node*.pid; do
        [[ -f $f ]] || continue
        m=${f##*/node}
        m=${m%.pid}
        curl -sf -m 2 -o /dev/null "$(url_of "$m")/v0/status" && { join=$(url_of "$m"); break; }
      done
    fi
    [[ -n $join ]] || die "node$i is new and no member of $DATA answers to take the cluster map from (start the cluster, or set JOIN=<a member's URL>)"
    flags=(--join "$join")
  fi
  launch "$i" "${flags[@]}"
  pid=$LAUNCHED
  if ! await "$i" "$pid"; then
    die "node$i left the cluster earlier (see $DATA/node$i.log): delete $DATA/node$i to use the number again"
  fi
  echo "node$i running: $(url_of "$i")  admin http://$HOST:$((ADMIN_PORT + i - 1))/metrics  log $DATA/node$i.log  (make stop-node N=$i$same stops it)"
}

# stop [N]: SIGTERM to node N's pid file, or to every node's of DATA, and
# wait for them to exit.
stop() {
  local f pid pids=() which=("$DATA"/node*.pid)
  [[ -n ${1:-} ]] && which=("$DATA/node$1.pid")
  for f in "${which[@]}"; do
    [[ -f $f ]] || continue
    pid=$(<"$f")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  if ((${#pids[@]} == 0)); then
    local what=cluster
    [[ -n ${1:-} ]] && what=node$1
    echo "no $what running from $DATA (PORT=$PORT)"
    return
  fi
  # The nodes finish their requests and close Pebble (--shutdown-timeout,
  # 10 s by default); wait for that, so that the data directories are free
  # when this returns.
  for _ in $(seq 150); do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && { sleep 0.1; continue 2; }
    done
    echo "stopped ${1:+node$1 }(PORT=$PORT, data in $DATA)"
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
  # A 64 MiB ballast, as the cluster's nodes (launch), not 1 GiB of a
  # developer's disk.
  exec "$BIN/dhtkv" --listen "$HOST:$PORT" --admin-listen "$HOST:$ADMIN_PORT" --data-dir "$DATA/single" \
    --ballast-size "${BALLAST:-64MiB}"
}

case ${1:-} in
run) run ;;
stop) stop ;;
node) node "${2:-}" ;;
stop-node)
  [[ ${2:-} =~ ^[0-9]+$ ]] || die "stop-node: want N, a node number: make stop-node N=4"
  stop "$2"
  ;;
single) single ;;
*) die "usage: [PORT=8080] [ADMIN_PORT=PORT-2020] [DATA=dir] [BIN=bin] [JOIN=url] scripts/cluster.sh run|stop|node N|stop-node N|single" ;;
esac
