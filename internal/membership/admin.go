package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// Handler serves the admin port's /cluster: GET answers the
// cluster map and what the change this node drives waits for; POST
// /cluster/join?node=URL, /cluster/decommission?node=URL,
// /cluster/remove?node=URL, /cluster/replace?node=URL&with=URL and
// /cluster/replicas?n=N begin a
// change (202 with the first map; 409 with the reason when it cannot
// begin; 400 for a missing or malformed parameter). POST /cluster/abort ends the
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
		usage, known, ok := clusterParams(r.URL.Path)
		if !ok {
			refuse(http.StatusNotFound, fmt.Errorf("unknown path %s: /cluster, /cluster/join, /cluster/decommission, /cluster/remove, /cluster/replace, /cluster/replicas, /cluster/abort", r.URL.Path))
			return
		}
		// A parameter the path does not take, or a malformed query, is
		// refused before anything else is read; so is one given twice
		// with different values (param).
		q, qerr := queryparam.Strict(r.URL.RawQuery, usage, known...)
		param := func(name string) string {
			v, err := queryparam.One(name, q[name])
			if err != nil && qerr == nil {
				qerr = err
			}
			return v
		}
		if r.URL.Path == "/cluster" {
			if r.Method != http.MethodGet {
				w.Header().Set("Allow", "GET")
				refuse(http.StatusMethodNotAllowed, errors.New("method not allowed: GET"))
				return
			}
			if qerr != nil {
				refuse(http.StatusBadRequest, qerr)
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
		node, with, factor := param("node"), param("with"), param("n")
		if qerr != nil {
			refuse(http.StatusBadRequest, qerr)
			return
		}
		var m *clustermap.Map
		var err error
		switch r.URL.Path {
		case "/cluster/replicas":
			n, perr := parseFactor(factor)
			if perr != nil {
				refuse(http.StatusBadRequest, perr)
				return
			}
			m, err = s.SetReplicas(n)
			answer(reply, refuse, m, err)
			return
		case "/cluster/abort":
			m, err = s.Abort()
			answer(reply, refuse, m, err)
			return
		}
		// Every node URL a change names is checked here: one that does not
		// parse is the request's fault (400), whatever the change.
		if node == "" {
			refuse(http.StatusBadRequest, errors.New("missing node=URL"))
			return
		}
		if _, perr := clustermap.NormalizeURL(node); perr != nil {
			refuse(http.StatusBadRequest, perr)
			return
		}
		switch r.URL.Path {
		case "/cluster/join":
			if err = s.admissible(admissible, node); err == nil {
				m, err = s.Join(node)
			}
		case "/cluster/decommission":
			force, ferr := queryparam.Bool("force", q["force"], false)
			if ferr != nil {
				refuse(http.StatusBadRequest, ferr)
				return
			}
			m, err = s.Decommission(node, force)
		case "/cluster/remove":
			m, err = s.Remove(node)
		case "/cluster/replace":
			if with == "" {
				refuse(http.StatusBadRequest, errors.New("missing with=URL (the new machine)"))
				return
			}
			if _, perr := clustermap.NormalizeURL(with); perr != nil {
				refuse(http.StatusBadRequest, fmt.Errorf("with: %w", perr))
				return
			}
			if err = s.admissible(admissible, with); err == nil {
				m, err = s.Replace(node, with)
			}
		}
		answer(reply, refuse, m, err)
	})
}

// answer replies to a change's request: 202 with its first map, 409 when
// it was refused, 503 when the log did not answer in time (no leader: a
// majority of its voters down or cut off, or an election that outlasted
// the call), 500 when this node failed to install it.
//
// A request the log did not answer may still be applied once a leader
// takes it, so the 503's reason says to look before asking again; asked
// again, it is a new request, which the log refuses if the first one took.
func answer(reply func(int, any), refuse func(int, error), m *clustermap.Map, err error) {
	switch {
	case errors.Is(err, ErrChangeRefused):
		refuse(http.StatusConflict, err)
	case errors.Is(err, context.DeadlineExceeded):
		refuse(http.StatusServiceUnavailable, fmt.Errorf("the cluster map's log did not answer within %v: it has no leader a majority of its voters agree on "+
			"(are they up and reachable?); the change may still be applied, see GET /cluster before asking again: %w", logCallTimeout, err))
	case err != nil:
		refuse(http.StatusInternalServerError, err)
	default:
		reply(http.StatusAccepted, m)
	}
}

// parseFactor reads /cluster/replicas' n: a whole number from 1 to
// MaxNodeID+1 (the map then bounds it by its number of nodes, a 409).
// clusterParams is what a path of /cluster takes: the usage its refusal
// of another parameter gives, the parameters, and whether the path is
// one of /cluster's.
func clusterParams(path string) (usage string, known []string, ok bool) {
	switch path {
	case "/cluster", "/cluster/abort":
		return "", nil, true
	case "/cluster/join", "/cluster/remove":
		return "node=URL", []string{"node"}, true
	case "/cluster/decommission":
		return "node=URL, force=true (below the replication factor)", []string{"node", "force"}, true
	case "/cluster/replace":
		return "node=URL (the member replaced), with=URL (the new machine)", []string{"node", "with"}, true
	case "/cluster/replicas":
		return "n=N, the new replication factor", []string{"n"}, true
	}
	return "", nil, false
}

func parseFactor(raw string) (int, error) {
	if raw == "" {
		return 0, errors.New("missing n=N, the new replication factor")
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > clustermap.MaxNodeID+1 {
		return 0, fmt.Errorf("bad n=%q: want the new replication factor, a whole number from 1 to the number of nodes", raw)
	}
	return n, nil
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
