// Package metrics holds a node's Prometheus registry. Each package that
// measures something owns its instruments (httpapi the requests, cluster
// the coordinator and replica calls, rpc the batches, scan the streams,
// cache and store their collectors) and registers them here; this package
// keeps only what they share. Each node has its own registry (tests run
// several nodes in one process); it is served on the admin listener at
// /metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a registry holding the Go runtime and process
// collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// LatencyBuckets are the upper bounds, in seconds, of every request and
// replica-call latency histogram: 50 µs to about 3.3 s, doubling. A cache
// hit takes tens of µs, a synced write 0.3 ms and more, a replica timeout
// hundreds of ms.
func LatencyBuckets() []float64 { return prometheus.ExponentialBuckets(50e-6, 2, 17) }
