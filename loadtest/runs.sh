# Sourced by the comparison scripts (not run): record keeps one dhtkv-load
# --json result per named series, table prints each series' median rps,
# p50 and p99 and its rps as a ratio of a baseline series.
declare -A rps p50 p99
record() { # name json
  echo "$1 $2"
  rps[$1]+="$(jq -r .throughput_rps <<<"$2") "
  p50[$1]+="$(jq -r '.latency_us["50"]' <<<"$2") "
  p99[$1]+="$(jq -r '.latency_us["99"]' <<<"$2") "
}
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
table() { # baseline-prefix series... (a series' baseline: the prefix, then its part after the first "-")
  local prefix=$1 k base m
  shift
  echo
  printf "%-12s %10s %10s %10s %8s\n" run "rps" "p50 µs" "p99 µs" "ratio"
  for k in "$@"; do
    base=$(median "${rps[$prefix-${k#*-}]}")
    m=$(median "${rps[$k]}")
    printf "%-12s %10.0f %10s %10s %7.0f%%\n" "$k" "$m" "$(median "${p50[$k]}")" "$(median "${p99[$k]}")" "$(awk -v a="$m" -v b="$base" 'BEGIN{print 100*a/b}')"
  done
}
