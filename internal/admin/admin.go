// Package admin serves the operator's endpoints on their own listener, never
// on the public port: net/http/pprof under /debug/pprof/ and Prometheus
// metrics at /metrics.
package admin

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the admin mux. It registers pprof's handlers explicitly on
// a private mux instead of importing net/http/pprof for its side effect on
// http.DefaultServeMux (global state another listener could expose).
func Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // heap, allocs, goroutine, mutex, block, ...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}
