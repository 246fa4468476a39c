package main

import (
	"os"
	"runtime"
)

// defaultMinProcs is --min-procs' default.
const defaultMinProcs = 8

// minProcs is the GOMAXPROCS the process should run with for --min-procs
// min: min when Go chose fewer Ps because the process has fewer cores
// (procs equal to the CPUs of its affinity mask, numCPU), and procs, Go's
// choice, otherwise: when GOMAXPROCS is set in the environment (env), and
// when a CPU quota made Go choose fewer Ps than the cores it may run on.
//
// Why more Ps than cores: Pebble's flushes and compactions are CPU-bound
// goroutines, and the Go scheduler preempts one only every 10 ms; on a
// node with two Ps, a flush and a compaction hold both, and a request's
// goroutine waits its turn in their run queue. With more Ps than cores
// the request's goroutine runs on a thread of its own, which the
// operating system's scheduler runs within a fraction of that
// (docs/benchmarks.md section 26: the cluster's PUT p99 at half load 6.5
// ms with 8 Ps on 2 cores against 13-14 ms with 2, for 12% more CPU per
// request). Not under a quota: threads beyond it would use the period's
// quota up early and be throttled for the rest of it, which is worse.
func minProcs(min, procs, numCPU int, env bool) int {
	if env || min <= procs || procs < numCPU {
		return procs
	}
	return min
}

// raiseProcs applies --min-procs; it returns GOMAXPROCS before and after.
func raiseProcs(min int) (before, after int) {
	before = runtime.GOMAXPROCS(0)
	_, env := os.LookupEnv("GOMAXPROCS")
	after = minProcs(min, before, runtime.NumCPU(), env)
	if after != before {
		runtime.GOMAXPROCS(after)
	}
	return before, after
}
