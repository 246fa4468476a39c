# Sourced by the load scripts (not run): mark_load PIDFILE SIG opens
# (USR1) or closes (USR2) the marked window of the dhtkv-load whose pid is
# in PIDFILE (its requests due in the window are summed up apart,
# loadgen.Mark). Only a live process whose executable is dhtkv-load is
# signalled: the file may name a generator that ended, and its pid a
# process of another program since.
mark_load() {
  local p
  p=$(cat "$1" 2>/dev/null) || return 0
  case $(readlink "/proc/$p/exe" 2>/dev/null) in */dhtkv-load) kill "-$2" "$p" 2>/dev/null || true ;; esac
}
