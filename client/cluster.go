package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// ClusterMap is a node's cluster map (docs/membership.md): its nodes, the
// replication factor, the epoch, and the membership change under way.
type ClusterMap struct {
	Cluster  uint64        `json:"cluster"`
	Epoch    uint64        `json:"epoch"`
	Replicas int           `json:"replicas"`
	Nodes    []ClusterNode `json:"nodes"`
	NextID   int           `json:"next_id"`
	Change   *Change       `json:"change,omitempty"`
	// Removing are dead members a remove counted dead during another
	// change: the cluster removes each in turn once that change is over.
	Removing []int `json:"removing,omitempty"`
}

// ClusterNode is one member of a ClusterMap.
type ClusterNode struct {
	ID   int    `json:"id"`
	URL  string `json:"url"`
	Seed uint64 `json:"seed"`
}

// Change is a membership change under way: Kind "join" or
// "decommission" of node Node, or "replicas" (the replication factor
// changing to Replicas; Node is then the driver), at Stage "write-both",
// "stream" or "read-new", driven by node Driver. Dead marks a
// decommission whose leaving node is dead (Client.Remove): nothing waits
// for it.
type Change struct {
	Kind     string `json:"kind"`
	Node     int    `json:"node"`
	Stage    string `json:"stage"`
	Driver   int    `json:"driver"`
	Replicas int    `json:"replicas,omitempty"`
	Dead     bool   `json:"dead,omitempty"`
}

// NodeURL returns the URL of node id, or "" when the map has none.
func (m *ClusterMap) NodeURL(id int) string {
	for _, n := range m.Nodes {
		if n.ID == id {
			return n.URL
		}
	}
	return ""
}

// ClusterStatus is what a node's admin listener answers to GET /cluster:
// its map, its id in it (-1: it left), the epoch of the last stream stage
// whose partitions it finished copying, and, on the node driving a
// change, what the change waits for.
type ClusterStatus struct {
	Map    *ClusterMap `json:"map"`
	Self   int         `json:"self"`
	Moved  uint64      `json:"moved"`
	Driver string      `json:"driver,omitempty"`
	// On a node that keeps the map on its log: the members whose
	// acknowledgement the change's next step waits for, and how the last
	// change ended.
	Waiting []int          `json:"waiting,omitempty"`
	Last    *ChangeOutcome `json:"last,omitempty"`
}

// ChangeOutcome is how a membership change ended, as the map's log
// recorded it: its kind and node, the epochs of its first map and of the
// map without it, and whether it was aborted.
type ChangeOutcome struct {
	ID      string `json:"id,omitempty"`
	Kind    string `json:"kind"`
	Node    int    `json:"node"`
	Began   uint64 `json:"began"`
	Ended   uint64 `json:"ended"`
	Aborted bool   `json:"aborted,omitempty"`
}

// ErrChangeRefused is a membership change a node would not begin (another
// is under way, a member has not acknowledged the current map, the node
// is not a member...); the error says why.
var ErrChangeRefused = errors.New("membership change refused")

// Cluster returns the cluster status of the node whose admin listener is
// at admin (host:port or http://host:port).
func (c *Client) Cluster(ctx context.Context, admin string) (*ClusterStatus, error) {
	ep, err := normalize(admin)
	if err != nil {
		return nil, err
	}
	a, err := c.try(ctx, ep, http.MethodGet, "/cluster", nil, nil, false)
	if err != nil {
		return nil, fmt.Errorf("dhtkv: cluster status of %s: %w", ep, err)
	}
	if err := authRefusal(a); err != nil {
		return nil, fmt.Errorf("dhtkv: cluster status of %s: %w", ep, err)
	}
	if a.code != http.StatusOK {
		return nil, fmt.Errorf("dhtkv: cluster status of %s: %d %s", ep, a.code, reason(a.body))
	}
	var st ClusterStatus
	if err := json.Unmarshal(a.body, &st); err != nil || st.Map == nil {
		return nil, fmt.Errorf("dhtkv: cluster status of %s: bad answer: %v", ep, err)
	}
	return &st, nil
}

// Join asks the node whose admin listener is at admin to begin adding the
// node at nodeURL (http://host:port) to its cluster; start that node with
// --join naming a member. It returns the change's first map; the change
// goes on in the background (watch it with Cluster).
func (c *Client) Join(ctx context.Context, admin, nodeURL string) (*ClusterMap, error) {
	return c.change(ctx, admin, "/cluster/join", url.Values{"node": {nodeURL}})
}

// Decommission asks the node whose admin listener is at admin to begin
// removing the node at nodeURL: its partitions move to the others, then it
// stops. Refused (ErrChangeRefused, with the reason) when it would leave
// fewer nodes than the replication factor, unless Force is given: lower
// the factor first (SetReplicas).
func (c *Client) Decommission(ctx context.Context, admin, nodeURL string, opts ...ChangeOption) (*ClusterMap, error) {
	q := url.Values{"node": {nodeURL}}
	for _, o := range opts {
		o(q)
	}
	return c.change(ctx, admin, "/cluster/decommission", q)
}

// ChangeOption modifies a membership change's request.
type ChangeOption func(url.Values)

// Force lets a decommission leave fewer nodes than the replication
// factor: each node left then holds every partition, and requests at the
// default ack fail while any one of them is down.
func Force() ChangeOption { return func(q url.Values) { q.Set("force", "true") } }

// Remove asks the node whose admin listener is at admin to begin
// removing the dead node at nodeURL, whose machine will not come back: a
// decommission that waits for nothing from it (the others copy its
// partitions from the remaining replicas), at whose end it is out of the
// map. Refused (ErrChangeRefused, with the reason) when the node answers,
// during another change (but the decommission of that node, which then
// finishes without it), or when the cluster would be left with fewer
// nodes than the replication factor.
func (c *Client) Remove(ctx context.Context, admin, nodeURL string) (*ClusterMap, error) {
	return c.change(ctx, admin, "/cluster/remove", url.Values{"node": {nodeURL}})
}

// Replace asks the node whose admin listener is at admin to give the
// identity of the dead node at deadURL to a new, empty machine at
// newURL, which is then started with --join and rebuilds the dead node's
// data.
func (c *Client) Replace(ctx context.Context, admin, deadURL, newURL string) (*ClusterMap, error) {
	return c.change(ctx, admin, "/cluster/replace", url.Values{"node": {deadURL}, "with": {newURL}})
}

// SetReplicas asks the node whose admin listener is at admin to begin
// changing the replication factor to n (from 1 to the number of nodes):
// the nodes that gain partitions copy them, and those that lose some drop
// them at the end, through the stages of a join.
func (c *Client) SetReplicas(ctx context.Context, admin string, n int) (*ClusterMap, error) {
	return c.change(ctx, admin, "/cluster/replicas", url.Values{"n": {strconv.Itoa(n)}})
}

// Abort asks the node whose admin listener is at admin to end the
// membership change under way with the old set of nodes, which the map's
// log allows before the change's read-new stage; it returns the map
// without the change. Refused (ErrChangeRefused, with the reason) past
// that stage, with no change under way, or on a node without the log.
func (c *Client) Abort(ctx context.Context, admin string) (*ClusterMap, error) {
	return c.change(ctx, admin, "/cluster/abort", url.Values{})
}

func (c *Client) change(ctx context.Context, admin, path string, q url.Values) (*ClusterMap, error) {
	pathQuery := path + "?" + q.Encode()
	ep, err := normalize(admin)
	if err != nil {
		return nil, err
	}
	a, err := c.try(ctx, ep, http.MethodPost, path, q, nil, false)
	if err != nil {
		return nil, fmt.Errorf("dhtkv: %s on %s: %w", pathQuery, ep, err)
	}
	switch a.code {
	case http.StatusAccepted:
	case http.StatusConflict:
		// The node's reason starts with its own "membership change
		// refused: ", which ErrChangeRefused says already.
		why := strings.TrimPrefix(reason(a.body), ErrChangeRefused.Error()+": ")
		return nil, fmt.Errorf("dhtkv: %w: %s", ErrChangeRefused, why)
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
		return nil, &BadRequestError{StatusCode: a.code, Reason: reason(a.body)}
	default:
		return nil, fmt.Errorf("dhtkv: %s on %s: %d %s", pathQuery, ep, a.code, reason(a.body))
	}
	var m ClusterMap
	if err := json.Unmarshal(a.body, &m); err != nil {
		return nil, fmt.Errorf("dhtkv: %s on %s: bad answer: %w", pathQuery, ep, err)
	}
	return &m, nil
}
