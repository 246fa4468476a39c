package admin

import (
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync"
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
			q := r.URL.Query()
			for name := range q {
				if name != "mutex" && name != "block" {
					plain(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: mutex=N, block=NS", name))
					return
				}
			}
			rate := func(name string) (int, bool, error) {
				if !q.Has(name) {
					return 0, false, nil
				}
				n, err := strconv.Atoi(q.Get(name))
				if err != nil || n < 0 {
					return 0, false, fmt.Errorf("%s=%q: want a whole number, 0 or more", name, q.Get(name))
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
