#!/bin/sh
# The init container of every dhtkv pod (docs/kubernetes.md). It runs in
# the dhtkv-init image (packaging/Dockerfile, target init: busybox and
# dhtkvctl) before the node, and writes what the node's container reads:
#
#   $RUN_DIR/node.conf       the --config file (DHTKV_CONFIG): "cluster
#                            SEED_URLS" for a seed pod, "join DRIVER_URL"
#                            for any other
#   $RUN_DIR/cluster-secret  copies of the Secret's files, mode 0600 and
#   $RUN_DIR/client-tokens   owned by the node's user (the kubelet makes a
#                            secret volume group-readable under fsGroup,
#                            which the node warns about)
#
# A pod whose ordinal (the number at the end of POD_NAME) is below the
# number of SEED_URLS is a seed: it seeds the cluster map from the list at
# its first start, and on an empty volume later it rebuilds its share
# under the same identity (docs/membership.md). Any other pod joins: on an
# empty volume whose URL the driver's map does not hold yet, it asks the
# driver (`dhtkvctl join --no-wait`), retrying every RETRY seconds while
# the driver does not answer or refuses (another change under way, a
# member down); the node then starts with --join and takes its share by
# the change's stages. A pod whose URL is in the map already (a restart, a
# volume lost: it rebuilds) or whose volume has data (a node that left,
# which the node itself then says) asks for nothing.
#
# Environment (set by statefulset.yaml; the test in this directory sets
# loopback ones):
#   POD_NAME      the pod's name, ending in -ORDINAL
#   SELF_URL      this pod's node URL, http://POD.SERVICE:PORT
#   SEED_URLS     the seed pods' URLs, comma-separated, ordinal order
#   DRIVER_URL    the URL a joining node takes the map from (--join)
#   DRIVER_ADMIN  host:port of the admin listener that drives joins
#   DATA_DIR      the node's --data-dir
#   SECRETS_DIR   where the Secret is mounted
#   RUN_DIR       the volume shared with the node's container
#   RETRY         seconds between two tries (default 5)
#   DHTKV_TOKEN_FILE  dhtkvctl's admin token, for the join
set -eu

log() { echo "dhtkv-init: $*" >&2; }

for v in POD_NAME SELF_URL SEED_URLS DRIVER_URL DRIVER_ADMIN DATA_DIR SECRETS_DIR RUN_DIR; do
	eval "val=\${$v:-}"
	if [ -z "$val" ]; then
		log "$v is not set"
		exit 2
	fi
done
retry=${RETRY:-5}

ordinal=${POD_NAME##*-}
case $ordinal in
'' | *[!0-9]*)
	log "POD_NAME $POD_NAME does not end in -ORDINAL"
	exit 2
	;;
esac

umask 077
for f in cluster-secret client-tokens; do
	cat "$SECRETS_DIR/$f" >"$RUN_DIR/$f.new"
	mv "$RUN_DIR/$f.new" "$RUN_DIR/$f"
done

# The seeds: the ordinal-th URL of the list must be this pod's.
i=0
seed=""
for u in $(echo "$SEED_URLS" | tr ',' ' '); do
	if [ "$i" -eq "$ordinal" ]; then
		seed=$u
	elif [ "$u" = "$SELF_URL" ]; then
		log "SELF_URL $SELF_URL is seed $i of SEED_URLS, but this pod's ordinal is $ordinal"
		exit 2
	fi
	i=$((i + 1))
done
if [ -n "$seed" ]; then
	if [ "$seed" != "$SELF_URL" ]; then
		log "seed $ordinal of SEED_URLS is $seed, not SELF_URL $SELF_URL: the StatefulSet's or the Service's name changed without SEED_URLS"
		exit 2
	fi
	printf 'cluster %s\n' "$SEED_URLS" >"$RUN_DIR/node.conf"
	log "seed $ordinal of $i: --cluster $SEED_URLS"
	exit 0
fi

printf 'join %s\n' "$DRIVER_URL" >"$RUN_DIR/node.conf"
if [ -n "$(ls -A "$DATA_DIR" 2>/dev/null)" ]; then
	log "$DATA_DIR holds data: the node starts on its stored map, no join asked"
	exit 0
fi
while :; do
	if st=$(dhtkvctl cluster --admin "$DRIVER_ADMIN" --json); then
		case $st in
		*"\"url\":\"$SELF_URL\""*)
			log "$SELF_URL is in the cluster map of $DRIVER_ADMIN: --join $DRIVER_URL"
			exit 0
			;;
		esac
		if dhtkvctl join --admin "$DRIVER_ADMIN" --no-wait "$SELF_URL"; then
			log "join of $SELF_URL begun by $DRIVER_ADMIN: --join $DRIVER_URL"
			exit 0
		fi
	fi
	log "$SELF_URL not joined yet; trying again in ${retry}s"
	sleep "$retry"
done
