package admin

import (
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// ProfileRatesHandler switches the mutex and block profiles, which cost
// nothing while off (the runtime's default) and are therefore off until
// an operator or a benchmark turns them on:
//
//	GET  /debug/pprof/rates                 the current rates
//	POST /debug/pprof/rates?mutex=N         sample 1 in N mutex contention
//	                                        events (0: off)
//	POST /debug/pprof/rates?block=NS        sample blocking events, one
//	                                        per NS nanoseconds blocked on
//	                                        average (0: off; 1: every one)
//
// Both may be given at once; the answer is the rates after the change, as
// JSON. Then /debug/pprof/mutex and /debug/pprof/block have something to
// show. The rates are the process's (runtime.SetMutexProfileFraction,
// runtime.SetBlockProfileRate): one node per process.
func ProfileRatesHandler() http.Handler {
	var mu sync.Mutex
	block := 0 // the runtime does not report the block rate back
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodGet:
		case http.MethodPost:
			q, err := queryparam.Strict(r.URL.RawQuery, "mutex=N, block=NS", "mutex", "block")
			if err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
			rate := func(name string) (int, bool, error) {
				if !q.Has(name) {
					return 0, false, nil
				}
				v, err := queryparam.One(name, q[name])
				if err != nil {
					return 0, false, err
				}
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return 0, false, fmt.Errorf("%s=%q: want a whole number, 0 or more", name, v)
				}
				return n, true, nil
			}
			m, setM, err := rate("mutex")
			if err == nil {
				var b int
				var setB bool
				if b, setB, err = rate("block"); err == nil {
					if setM {
						runtime.SetMutexProfileFraction(m)
					}
					if setB {
						runtime.SetBlockProfileRate(b)
						block = b
					}
				}
			}
			if err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
		default:
			w.Header().Set("Allow", "GET, POST")
			plain(w, http.StatusMethodNotAllowed, "method not allowed: GET, POST")
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"mutex": runtime.SetMutexProfileFraction(-1), "block": block})
	})
}

// The windows of the pprof handlers boundProfile guards: how their
// seconds parameter is read, and what its absence means.
var (
	// cpuWindow is /debug/pprof/profile's: whole seconds, 30 without.
	cpuWindow = window{def: 30}
	// traceWindow is /debug/pprof/trace's: seconds with a fraction, 1
	// without.
	traceWindow = window{def: 1, fraction: true}
	// deltaWindow is a named profile's (/debug/pprof/allocs?seconds=N, a
	// delta): whole seconds; without, a snapshot, no window.
	deltaWindow = window{}
)

type window struct {
	def      float64 // seconds when the parameter is absent
	fraction bool    // seconds may have a fraction
}

// boundProfile serves next (a net/http/pprof handler) only when its
// seconds parameter asks for a window of at most limit: a positive number
// of seconds as win reads it, or none. Otherwise 400 with a one-line
// reason: net/http/pprof would run a profile as long as its client waits,
// and take a malformed seconds as its default.
func boundProfile(limit time.Duration, win window, next http.Handler) http.Handler {
	def, fraction := win.def, win.fraction
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.FormValue("seconds")
		sec := def
		if raw != "" {
			var err error
			if fraction {
				sec, err = strconv.ParseFloat(raw, 64)
			} else {
				var n int64
				n, err = strconv.ParseInt(raw, 10, 64)
				sec = float64(n)
			}
			if err != nil || !(sec > 0) {
				plain(w, http.StatusBadRequest, fmt.Sprintf("seconds=%q: want a positive number of seconds, at most %d (--admin-max-profile %s)", raw, int64(limit.Seconds()), limit))
				return
			}
		}
		if sec > limit.Seconds() {
			what := fmt.Sprintf("seconds=%s", raw)
			if raw == "" {
				what = fmt.Sprintf("the default %g s", def)
			}
			plain(w, http.StatusBadRequest, fmt.Sprintf("%s: longer than --admin-max-profile %s; ask for at most %d seconds", what, limit, int64(limit.Seconds())))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cpuProfiling and tracing are held while a CPU profile or an execution
// trace is taken: the runtime takes one of each at a time, for the whole
// process (the nodes of an in-process test cluster share them).
var cpuProfiling, tracing sync.Mutex

// The one-line reasons of a 409 from exclusive.
const (
	cpuBusy   = "a CPU profile is being taken: try again when it ends"
	traceBusy = "an execution trace is being taken: try again when it ends"
)

// exclusive serves next (pprof.Profile or pprof.Trace) while it holds
// mu, and answers 409 with busy when another request holds it:
// net/http/pprof would answer 500 ("cpu profiling already in use").
func exclusive(mu *sync.Mutex, busy string, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !mu.TryLock() {
			plain(w, http.StatusConflict, busy)
			return
		}
		defer mu.Unlock()
		next(w, r)
	})
}
