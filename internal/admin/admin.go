// Package admin serves the operator's endpoints on their own listener, never
// on the public port: net/http/pprof under /debug/pprof/, Prometheus
// metrics at /metrics, the liveness and readiness probes /livez and
// /readyz, the anti-entropy trigger /repair (repair.go), the backup
// trigger /snapshot (snapshot.go), the run-time log level /log-level
// (loglevel.go) and membership's /cluster endpoints;
// Mux puts them on one mux (mux.go).
package admin

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns the admin mux. It registers pprof's handlers explicitly on
// a private mux instead of importing net/http/pprof for its side effect on
// http.DefaultServeMux (global state another listener could expose).
//
// The probes, GET or HEAD:
//
//   - /livez answers 200 "ok" whenever it answers at all: the process is
//     serving. Restart a node whose /livez does not answer.
//   - /readyz answers 200 "ok" when ready() returns nil, else 503 and
//     ready's error as a one-line reason. Send client traffic only to a
//     node whose /readyz answers 200.
//
// A CPU profile, a trace or a delta profile (?seconds=N) longer than
// maxProfile (0: DefaultOptions') is refused with 400 (boundProfile); a
// CPU profile or a trace asked for while one is taken, with 409
// (exclusive).
func Handler(reg *prometheus.Registry, ready func() error, maxProfile time.Duration) http.Handler {
	if maxProfile <= 0 {
		maxProfile = DefaultOptions().MaxProfile
	}
	mux := newMux()
	mux.Handle("/debug/pprof/", boundProfile(maxProfile, deltaWindow, http.HandlerFunc(pprof.Index))) // heap, allocs, goroutine, mutex, block, ...
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.Handle("/debug/pprof/profile", boundProfile(maxProfile, cpuWindow, exclusive(&cpuProfiling, cpuBusy, pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", limitBody(maxSymbolBody, http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", boundProfile(maxProfile, traceWindow, exclusive(&tracing, traceBusy, pprof.Trace)))
	mux.Handle("/debug/pprof/rates", ProfileRatesHandler())
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			plain(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		plain(w, http.StatusOK, "ok")
	})
	return mux
}

// maxSymbolBody bounds POST /debug/pprof/symbol's body: pprof.Symbol
// reads it whole and buffers a line of answer (the function's full name)
// per address in it. A lookup of every address of a large profile is
// a few hundred KiB.
const maxSymbolBody = 1 << 20

// limitBody answers 413 to a request whose declared body is over max, and
// cuts a longer undeclared one (chunked) at max.
func limitBody(max int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			plain(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body of %d bytes: at most %d", r.ContentLength, max))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
		next.ServeHTTP(w, r)
	})
}

func plain(w http.ResponseWriter, code int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(line + "\n")) // the client may have gone; nothing to do about it
}
