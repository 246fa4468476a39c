package admin

import (
	"context"
	"encoding/json"
	"net/http"
)

// RepairHandler serves the on-demand anti-entropy trigger:
//
//	POST /repair          compare with every peer now; answer when all
//	                      exchanges ended, with what each found and did
//	POST /repair?wait=0   start them and answer 202 at once
//	GET  /repair          every peer's anti-entropy state (last success,
//	                      running exchange's progress, last exchange)
//
// run starts the exchanges and waits for them until its context ends
// (then it returns nil: they go on); state returns the peers' state. Both
// answers are JSON.
func RepairHandler(run func(context.Context) any, state func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, state())
		case http.MethodPost:
			if r.URL.Query().Get("wait") == "0" {
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
