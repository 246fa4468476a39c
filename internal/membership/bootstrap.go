package membership

import (
	"fmt"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Bootstrap is what a node's first map comes from.
type Bootstrap struct {
	// DataDir names the data directory in messages.
	DataDir string
	// Self is this node's URL (--self).
	Self string
	// Join is a member's URL (--join), or "".
	Join string
	// Topology is the --cluster list, which seeds a new cluster's map.
	Topology clustermap.Topology
	// Replicas is the replication factor a seeded map gets (--replicas;
	// 0: the list's size).
	Replicas int
	// Fetch asks the member at url for its State (rpc.FetchMap).
	Fetch func(url string) ([]byte, error)
}

// Map returns the cluster map the node starts with, and its id in it: the
// map in st; else, with Join, the member's (joined is then true); else one
// seeded from Topology. A map taken or seeded is stored in st before
// anything else happens.
func (b Bootstrap) Map(st *store.Store) (m *clustermap.Map, self int, joined bool, err error) {
	selfURL, err := clustermap.NormalizeURL(b.Self)
	if err != nil {
		return nil, 0, false, fmt.Errorf("--self: %w", err)
	}
	stored, ok, err := st.ClusterMap()
	if err != nil {
		return nil, 0, false, err
	}
	id, hasID, err := st.Identity()
	if err != nil {
		return nil, 0, false, err
	}
	switch {
	case ok:
		if m, err = clustermap.Decode(stored); err != nil {
			return nil, 0, false, fmt.Errorf("data directory %s: %w", b.DataDir, err)
		}
		me := m.ByURL(selfURL)
		if hasID && m.Node(id.Node) == nil {
			return nil, 0, false, fmt.Errorf("data directory %s belongs to node %d, which left the cluster (decommissioned; map %s): delete the directory to use this machine again", b.DataDir, id.Node, m)
		}
		if me == nil {
			return nil, 0, false, fmt.Errorf("--self %s is not in the cluster map of data directory %s (%s)", selfURL, b.DataDir, m)
		}
		return m, me.ID, false, nil
	case b.Join != "":
		if hasID {
			return nil, 0, false, fmt.Errorf("--join: data directory %s already belongs to node %d of cluster %016x", b.DataDir, id.Node, id.Cluster)
		}
		ans, err := b.Fetch(b.Join)
		if err != nil {
			return nil, 0, false, fmt.Errorf("--join: %w", err)
		}
		theirs, err := ParseState(ans)
		if err != nil {
			return nil, 0, false, fmt.Errorf("--join: the cluster map from %s: %w", b.Join, err)
		}
		m = theirs.Map
		me := m.ByURL(selfURL)
		if me == nil {
			return nil, 0, false, fmt.Errorf("--join: %s is not in the cluster map of %s (%s): add it first with dhtkvctl join %s (or replace)", selfURL, b.Join, m, selfURL)
		}
		self, joined = me.ID, true
	default:
		if m, err = clustermap.Seed(b.Topology.Nodes, b.Replicas); err != nil {
			return nil, 0, false, fmt.Errorf("--cluster: %w", err)
		}
		self = b.Topology.Self
	}
	if err := st.SetClusterMap(m.Encode()); err != nil {
		return nil, 0, false, err
	}
	return m, self, joined, nil
}
