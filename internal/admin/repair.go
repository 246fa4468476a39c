package admin

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// RepairHandler serves the on-demand anti-entropy trigger:
//
//	POST /repair          compare with every peer now; answer when all
//	                      exchanges ended, with what each found and did
//	POST /repair?wait=0   start them and answer 202 at once (wait takes
//	                      a boolean: 0, false, 1, true, or alone true)
//	GET  /repair          every peer's anti-entropy state (last success,
//	                      running exchange's progress, last exchange)
//
// run starts the exchanges and waits for them until its context ends
// (then it returns nil: they go on); state returns the peers' state. Both
// answers are JSON. Another parameter, a wait that is not a boolean or a
// malformed query is 400 with a one-line reason, and nothing starts.
func RepairHandler(run func(context.Context) any, state func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			if _, err := queryparam.Strict(r.URL.RawQuery, "GET /repair takes none"); err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
			writeJSON(w, http.StatusOK, state())
		case http.MethodPost:
			q, err := queryparam.Strict(r.URL.RawQuery, "wait=false answers 202 at once, wait=true (the default) when the exchanges ended", "wait")
			var wait bool
			if err == nil {
				wait, err = queryparam.Bool("wait", q["wait"], true)
			}
			if err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
			if !wait {
				ctx, cancel := context.WithCancel(r.Context())
				cancel() // start, do not wait
				run(ctx)
				writeJSON(w, http.StatusAccepted, map[string]string{"status": "started"})
				return
			}
			unboundedWrite(w) // the exchanges end by themselves; a large difference takes long
			res := run(r.Context())
			if res == nil {
				return // the client went away
			}
			writeJSON(w, http.StatusOK, res)
		default:
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, "method not allowed: use GET or POST", http.StatusMethodNotAllowed)
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}
