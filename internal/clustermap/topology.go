package clustermap

import (
	"fmt"
	"strings"

	"github.com/dhtkv/dhtkv/internal/hlc"
)

// Topology is the --cluster list as given: it seeds the cluster map on a
// node's first start (Seed), which is the source of truth from
// then on. Every node of a new cluster is started with the same list; a
// node's index in it becomes its id (the HLC tie-break), so the order of
// --cluster must be the same everywhere.
type Topology struct {
	Nodes []string // normalized base URLs, e.g. http://127.0.0.1:8080
	Self  int      // index of this node in Nodes
}

// ParseTopology validates the --cluster list and locates --self in it.
func ParseTopology(list, self string) (Topology, error) {
	selfN, err := NormalizeURL(self)
	if err != nil {
		return Topology{}, fmt.Errorf("--self: %w", err)
	}
	var t Topology
	t.Self = -1
	seen := map[string]bool{}
	for _, raw := range strings.Split(list, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		n, err := NormalizeURL(raw)
		if err != nil {
			return Topology{}, fmt.Errorf("--cluster: %w", err)
		}
		if seen[n] {
			return Topology{}, fmt.Errorf("--cluster: %s listed twice", n)
		}
		seen[n] = true
		if n == selfN {
			t.Self = len(t.Nodes)
		}
		t.Nodes = append(t.Nodes, n)
	}
	if len(t.Nodes) == 0 {
		t.Nodes, t.Self = []string{selfN}, 0
		return t, nil
	}
	if len(t.Nodes) > hlc.MaxNodeID+1 {
		return Topology{}, fmt.Errorf("--cluster: %d nodes, at most %d supported", len(t.Nodes), hlc.MaxNodeID+1)
	}
	if t.Self < 0 {
		return Topology{}, fmt.Errorf("--self %s is not in --cluster %s", selfN, strings.Join(t.Nodes, ","))
	}
	return t, nil
}

// Size is the number of nodes.
func (t Topology) Size() int { return len(t.Nodes) }
