// Package cluster places keys on nodes and coordinates requests across the
// replicas of a key: topology (the static node list), placement (rendezvous
// hashing) and the coordinator (fan-out, ack counting, newest-version-wins,
// read hedging, cluster-wide scans). It reaches other nodes through
// package rpc.
package cluster

import (
	"fmt"

	"net/url"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/dhtkv/dhtkv/internal/hlc"
)

// Topology is the static list of nodes. Every node is started with the same
// list; a node's index in it is its id (the HLC tie-break), so the order of
// --cluster must be the same everywhere.
type Topology struct {
	Nodes []string // normalized base URLs, e.g. http://127.0.0.1:8080
	Self  int      // index of this node in Nodes
}

// ParseTopology validates the --cluster list and locates --self in it.
func ParseTopology(list, self string) (Topology, error) {
	selfN, err := normalizeURL(self)
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
		n, err := normalizeURL(raw)
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

// normalizeURL accepts http://host:port (a trailing slash is dropped) and
// nothing else: the list is compared textually across nodes, and ID
// hashes it. The scheme is part of a node's name, not its transport:
// under TLS (--tls-cert) the list stays http:// and package rpc sends to
// the https:// form, so that turning TLS on or off keeps every data
// directory's cluster identity (docs/security.md).
func normalizeURL(s string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("bad node URL %q: %w", s, err)
	}
	if u.Scheme == "https" {
		return "", fmt.Errorf("bad node URL %q: want http://host:port, also under TLS: the URL names the node, --tls-cert makes the nodes talk TLS (docs/security.md)", s)
	}
	if u.Scheme != "http" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("bad node URL %q: want http://host:port", s)
	}
	return "http://" + u.Host, nil
}

// ID identifies the cluster: a hash of its node list in order (the order
// gives the nodes their ids). Every node of one cluster computes the same.
func (t Topology) ID() uint64 { return xxhash.Sum64String(strings.Join(t.Nodes, ",")) }

// Size is the number of nodes.
func (t Topology) Size() int { return len(t.Nodes) }
