// Package metrics holds a node's Prometheus registry. Each package that
// measures something owns its instruments (httpapi the requests, cluster
// the coordinator and replica calls, rpc the batches, scan the streams,
// cache and store their collectors) and registers them here; this package
// keeps only what they share. Each node has its own registry (tests run
// several nodes in one process); it is served on the admin listener at
// /metrics.
package metrics

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
)

// NewRegistry returns a registry holding the Go runtime and process
// collectors and dhtkv_build_info. The runtime collector adds, to its
// default set, from runtime/metrics: the distributions of GC pauses
// (go_gc_pauses_seconds) and of the time goroutines wait to run
// (go_sched_latencies_seconds), which a latency spike is matched with;
// and the CPU time the collector's marking and the scavenger's return of
// memory took (go_cpu_classes_gc_total_cpu_seconds_total,
// go_cpu_classes_scavenge_total_cpu_seconds_total), whose rate beside
// process_cpu_seconds_total says what share of the node's CPU went to
// the collector. The runtime counts those as the time its Ps spent on
// the work, so with more Ps than cores (--min-procs) they overstate it.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/(gc/pauses|sched/latencies):seconds$`)},
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/(gc|scavenge)/total:cpu-seconds$`)},
	)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	return reg
}

// buildInfo is the gauge dhtkv_build_info{version,goversion}, always 1: the
// usual way to put a build's version in a dashboard or an alert (join on
// it, or count the versions running).
func buildInfo() prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "dhtkv_build_info",
		Help:        "Always 1; its labels are the running build's version (buildinfo.Version) and Go release.",
		ConstLabels: prometheus.Labels{"version": buildinfo.Version(), "goversion": buildinfo.GoVersion()},
	})
	g.Set(1)
	return g
}

// LatencyBuckets are the upper bounds, in seconds, of every request and
// replica-call latency histogram: 50 µs to about 3.3 s, doubling. A cache
// hit takes tens of µs, a synced write 0.3 ms and more, a replica timeout
// hundreds of ms.
func LatencyBuckets() []float64 { return prometheus.ExponentialBuckets(50e-6, 2, 17) }
