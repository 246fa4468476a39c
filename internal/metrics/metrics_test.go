package metrics

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// The registry exports the runtime's GC pause and scheduling latency
// distributions and the collector's CPU time beside the default Go and
// process metrics.
func TestRegistryHasRuntimeLatencies(t *testing.T) {
	runtime.GC() // one pause at least
	families, err := NewRegistry().Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"go_gc_pauses_seconds", "go_sched_latencies_seconds", "go_goroutines",
		"go_cpu_classes_gc_total_cpu_seconds_total", "go_cpu_classes_scavenge_total_cpu_seconds_total", "process_cpu_seconds_total", "dhtkv_build_info"} {
		require.True(t, names[want], "%s is exported", want)
	}
}
