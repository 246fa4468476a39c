package node

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// clusterMap returns the cluster map the node starts with, and its id in
// it: the map in the data directory; else, with --join, the member's
// (joined is then true); else one seeded from --cluster. A map taken or
// seeded is stored before anything else happens.
func (n *Node) clusterMap(topo membership.Topology, peerTLS *tls.Config) (m *membership.Map, self int, joined bool, err error) {
	cfg := n.cfg
	selfURL, err := membership.NormalizeURL(cfg.Self)
	if err != nil {
		return nil, 0, false, fmt.Errorf("--self: %w", err)
	}
	stored, ok, err := n.store.ClusterMap()
	if err != nil {
		return nil, 0, false, err
	}
	id, hasID, err := n.store.Identity()
	if err != nil {
		return nil, 0, false, err
	}
	switch {
	case ok:
		if m, err = membership.Decode(stored); err != nil {
			return nil, 0, false, fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
		}
		me := m.ByURL(selfURL)
		if hasID && m.Node(id.Node) == nil {
			return nil, 0, false, fmt.Errorf("data directory %s belongs to node %d, which left the cluster (decommissioned; map %s): delete the directory to use this machine again", cfg.DataDir, id.Node, m)
		}
		if me == nil {
			return nil, 0, false, fmt.Errorf("--self %s is not in the cluster map of data directory %s (%s)", selfURL, cfg.DataDir, m)
		}
		return m, me.ID, false, nil
	case cfg.Join != "":
		if hasID {
			return nil, 0, false, fmt.Errorf("--join: data directory %s already belongs to node %d of cluster %016x", cfg.DataDir, id.Node, id.Cluster)
		}
		b, err := rpc.FetchMap(cfg.Join, rpc.PeerOptions{
			Timeout: cfg.ReplicaTimeout, Secret: cfg.ClusterSecret, Dial: cfg.PeerDial, TLS: peerTLS,
		})
		if err != nil {
			return nil, 0, false, fmt.Errorf("--join: %w", err)
		}
		var st cluster.MapState
		if err := json.Unmarshal(b, &st); err != nil || st.Map == nil {
			return nil, 0, false, fmt.Errorf("--join: the cluster map from %s does not parse", cfg.Join)
		}
		if m = st.Map; m.Validate() != nil {
			return nil, 0, false, fmt.Errorf("--join: the cluster map from %s: %w", cfg.Join, m.Validate())
		}
		me := m.ByURL(selfURL)
		if me == nil {
			return nil, 0, false, fmt.Errorf("--join: %s is not in the cluster map of %s (%s): add it first with dhtkvctl join %s (or replace)", selfURL, cfg.Join, m, selfURL)
		}
		self, joined = me.ID, true
	default:
		if m, err = membership.Seed(topo.Nodes, cfg.Replicas); err != nil {
			return nil, 0, false, fmt.Errorf("--cluster: %w", err)
		}
		self = topo.Self
	}
	if err := n.store.SetClusterMap(m.Encode()); err != nil {
		return nil, 0, false, err
	}
	return m, self, joined, nil
}

// left is called once the cluster map no longer has this node: it was
// decommissioned. The process stops (Left).
func (n *Node) left() {
	select {
	case n.leftCh <- struct{}{}:
	default:
	}
}

// Left fires when the node was decommissioned: it holds no partition any
// more and should stop; its data directory cannot be started again.
func (n *Node) Left() <-chan struct{} { return n.leftCh }

// clusterHandler serves the admin port's /cluster: GET answers the
// cluster map and what the change this node drives waits for; POST
// /cluster/join?node=URL, /cluster/decommission?node=URL and
// /cluster/replace?node=URL&with=URL begin a change (202 with the first
// map; 409 with the reason when it cannot begin).
func (n *Node) clusterHandler() http.Handler {
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
			reply(http.StatusOK, n.coord.ChangeStatus())
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			refuse(http.StatusMethodNotAllowed, errors.New("method not allowed: POST"))
			return
		}
		q := r.URL.Query()
		node := q.Get("node")
		if node == "" {
			refuse(http.StatusBadRequest, errors.New("missing node=URL"))
			return
		}
		var m *membership.Map
		var err error
		switch r.URL.Path {
		case "/cluster/join":
			if err = n.admissible(node); err == nil {
				m, err = n.coord.Join(node)
			}
		case "/cluster/decommission":
			m, err = n.coord.Decommission(node)
		case "/cluster/replace":
			with := q.Get("with")
			if with == "" {
				refuse(http.StatusBadRequest, errors.New("missing with=URL (the new machine)"))
				return
			}
			if err = n.admissible(with); err == nil {
				m, err = n.coord.Replace(node, with)
			}
		default:
			refuse(http.StatusNotFound, fmt.Errorf("unknown path %s: /cluster, /cluster/join, /cluster/decommission, /cluster/replace", r.URL.Path))
			return
		}
		switch {
		case errors.Is(err, cluster.ErrChangeRefused):
			refuse(http.StatusConflict, err)
		case err != nil:
			refuse(http.StatusInternalServerError, err)
		default:
			reply(http.StatusAccepted, m)
		}
	})
}

// admissible checks that a node URL may join under this node's security
// settings: without a secret or mutual TLS, only loopback ones
// (security.go).
func (n *Node) admissible(raw string) error {
	u, err := membership.NormalizeURL(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", cluster.ErrChangeRefused, err)
	}
	if err := checkExposure(n.cfg, []string{u}); err != nil {
		return fmt.Errorf("%w: %w", cluster.ErrChangeRefused, err)
	}
	return nil
}
