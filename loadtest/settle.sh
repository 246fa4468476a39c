# Sourced by the comparison scripts (not run): settle PORT... waits, up to
# 60 s, until the dhtkv nodes whose admin listeners are on PORT+10 have
# had no Pebble flush or compaction for a second, so that a run does not
# pay for the previous run's background work on the shared cores.
pebble() { # port... -> "flushes and compactions in progress, completed" summed
  for port in "$@"; do curl -s "http://127.0.0.1:$((port + 10))/metrics"; done |
    awk '$1 == "dhtkv_pebble_background_jobs" {b += $2} $1 == "dhtkv_pebble_compactions_total" || $1 == "dhtkv_pebble_flushes_total" {n += $2} END {printf "%d %d", b, n}'
}
settle() { # port...
  local prev now
  prev=$(pebble "$@")
  for _ in $(seq 60); do
    sleep 1
    now=$(pebble "$@")
    [ "$now" = "$prev" ] && [ "${now%% *}" = 0 ] && return
    prev=$now
  done
  echo "# warning: Pebble on ports $* still busy after 60 s" >&2
}
