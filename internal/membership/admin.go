package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// Handler serves the admin port's /cluster: GET answers the
// cluster map and what the change this node drives waits for; POST
// /cluster/join?node=URL, /cluster/decommission?node=URL and
// /cluster/replace?node=URL&with=URL begin a change (202 with the first
// map; 409 with the reason when it cannot begin); a join may name the new
// node's log address (&log=host:port). POST /cluster/abort ends the
// change under way (202 with the map without it; 409 when the log
// refuses, or without a log). admissible refuses a
// node URL this node's security settings do not let join (nil: any).
func (s *Service) Handler(admissible func(url string) error) http.Handler {
	if admissible == nil {
		admissible = func(string) error { return nil }
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply := func(code int, v any) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(v)
		}
		refuse := func(code int, err error) {
			http.Error(w, err.Error(), code)
		}
		if r.URL.Path == "/cluster" {
			if r.Method != http.MethodGet {
				w.Header().Set("Allow", "GET")
				refuse(http.StatusMethodNotAllowed, errors.New("method not allowed: GET"))
				return
			}
			reply(http.StatusOK, s.ChangeStatus())
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			refuse(http.StatusMethodNotAllowed, errors.New("method not allowed: POST"))
			return
		}
		q := r.URL.Query()
		if r.URL.Path == "/cluster/abort" {
			m, err := s.Abort()
			switch {
			case errors.Is(err, ErrChangeRefused):
				refuse(http.StatusConflict, err)
			case err != nil:
				refuse(http.StatusInternalServerError, err)
			default:
				reply(http.StatusAccepted, m)
			}
			return
		}
		node := q.Get("node")
		if node == "" {
			refuse(http.StatusBadRequest, errors.New("missing node=URL"))
			return
		}
		var m *clustermap.Map
		var err error
		switch r.URL.Path {
		case "/cluster/join":
			if err = s.admissible(admissible, node); err == nil {
				m, err = s.Join(node, q.Get("log"))
			}
		case "/cluster/decommission":
			m, err = s.Decommission(node)
		case "/cluster/replace":
			with := q.Get("with")
			if with == "" {
				refuse(http.StatusBadRequest, errors.New("missing with=URL (the new machine)"))
				return
			}
			if err = s.admissible(admissible, with); err == nil {
				m, err = s.Replace(node, with)
			}
		default:
			refuse(http.StatusNotFound, fmt.Errorf("unknown path %s: /cluster, /cluster/join, /cluster/decommission, /cluster/replace, /cluster/abort", r.URL.Path))
			return
		}
		switch {
		case errors.Is(err, ErrChangeRefused):
			refuse(http.StatusConflict, err)
		case err != nil:
			refuse(http.StatusInternalServerError, err)
		default:
			reply(http.StatusAccepted, m)
		}
	})
}

// admissible checks that a node URL may join: it parses, and check lets it.
func (s *Service) admissible(check func(string) error, raw string) error {
	u, err := clustermap.NormalizeURL(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	if err := check(u); err != nil {
		return fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return nil
}
