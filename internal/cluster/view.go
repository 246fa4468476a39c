package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// view is the coordinator's picture of the cluster at one epoch: the
// cluster map and what is derived from it. A view is immutable; a request
// loads the current one once and routes by it from start to end, and the
// calls it makes carry its epoch, so that a replica with a newer map
// refuses them (rpc/epoch.go) and the request is routed again.
type view struct {
	m    *membership.Map
	self int // this node's id; -1 once the map no longer has it (decommissioned)
	// The replica sets before and after the change under way, and which
	// of them requests use at the map's stage.
	*placement.Sets
	peers []*peer
	since time.Time // when this node installed the view
}

// newView derives the view of m for node self.
func (c *Coordinator) newView(m *membership.Map, self int) *view {
	v := &view{m: m, self: -1, peers: make([]*peer, membership.MaxNodeID+1), since: time.Now()}
	// A map in which this node's id is reached at another URL gave the
	// id to a replacement: this node is out as surely as if it had been
	// decommissioned (two nodes must never issue versions with one id).
	if n := m.Node(self); n != nil && (c.selfURL == "" || n.URL == c.selfURL) {
		v.self = self
	}
	v.Sets = placement.Of(m)
	for _, n := range m.Nodes {
		if n.ID != self {
			v.peers[n.ID] = c.peerFor(n.URL)
		}
	}
	return v
}

// url names node id for logs and errors.
func (v *view) url(id int) string {
	if n := v.m.Node(id); n != nil {
		return n.URL
	}
	return fmt.Sprintf("node %d (no longer a member)", id)
}

// others returns the ids of every node of the map but this one.
func (v *view) others() []int {
	out := make([]int, 0, len(v.m.Nodes))
	for _, n := range v.m.Nodes {
		if n.ID != v.self {
			out = append(out, n.ID)
		}
	}
	return out
}

// v returns the current view.
func (c *Coordinator) v() *view { return c.view.Load() }

// peerFor returns the client of the node at url, made once per URL for
// the coordinator's life (a node that leaves keeps its idle client until
// Close: there are at most MaxNodeID+1 of them).
func (c *Coordinator) peerFor(url string) *peer {
	c.clientsMu.Lock()
	defer c.clientsMu.Unlock()
	if p := c.clients[url]; p != nil {
		return p
	}
	o := c.peerOpts
	o.OnStale = c.onStale
	o.OnBehind = c.onBehind
	p := &peer{
		client:  rpc.NewPeer(url, o, c.rpcMetrics),
		reads:   c.m.calls(url, "get"),
		writes:  c.m.calls(url, "put"),
		readLat: new(latencyWindow),
	}
	c.clients[url] = p
	return p
}

// MapState is what a node answers on rpc.MapPath and with a refusal: its
// map, and the epoch of the last stream stage whose partitions it has
// finished copying (move.go).
type MapState struct {
	Node  int             `json:"node"`
	Map   *membership.Map `json:"map"`
	Moved uint64          `json:"moved"`
}

func (c *Coordinator) state() []byte {
	v := c.v()
	b, err := json.Marshal(MapState{Node: v.self, Map: v.m, Moved: c.moved.Load()})
	if err != nil {
		panic(fmt.Sprintf("cluster: encode map state: %v", err)) // plain data
	}
	return b
}

func parseState(b []byte) (MapState, error) {
	var s MapState
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("cluster map state: %w", err)
	}
	if s.Map == nil {
		return s, errors.New("cluster map state without a map")
	}
	return s, s.Map.Validate()
}

// MapHooks are the coordinator's side of the map protocol, for the rpc
// server (rpc.MapHooks).
func (c *Coordinator) MapHooks() rpc.MapHooks {
	return rpc.MapHooks{
		Admit:   c.admit,
		Release: c.gate.RUnlock,
		Epoch:   func() uint64 { return c.v().m.Epoch },
		State:   c.state,
		Offer: func(b []byte) ([]byte, error) {
			s, err := parseState(b)
			if err != nil {
				return nil, &rpc.Error{Status: 400, Msg: err.Error()}
			}
			if err := c.fromMember(s); err != nil {
				return nil, &rpc.Error{Status: 403, Msg: err.Error()}
			}
			if _, err := c.install(s.Map); err != nil {
				return nil, err
			}
			return c.state(), nil
		},
	}
}

// admit lets a batch (or a local replica call) routed at epoch be served:
// true unless this node's map is newer; the caller releases the gate
// after serving. install takes the gate exclusively, so no call admitted
// under one epoch is still being served once the next is installed.
func (c *Coordinator) admit(epoch uint64) bool {
	c.gate.RLock()
	if epoch < c.v().m.Epoch {
		c.gate.RUnlock()
		return false
	}
	return true
}

// fromMember checks that a map comes from a member of this node's map, at
// the URL this node knows it by. Maps are handed over only by members (a
// change's driver, a peer refusing a call, a peer answering behind), and
// the check keeps out a node of another cluster that happens to have the
// same cluster id: one seeded from the same --cluster list, such as a
// process left running from an earlier cluster on the same ports.
func (c *Coordinator) fromMember(s MapState) error {
	cur := c.v().m.Node(s.Node)
	sent := s.Map.Node(s.Node)
	if cur == nil || sent == nil || cur.URL != sent.URL {
		return fmt.Errorf("cluster map from node %d, which is not a member of this node's map (%s)", s.Node, c.v().m)
	}
	return nil
}

// ErrOtherCluster refuses a map of another cluster.
var ErrOtherCluster = errors.New("cluster map of another cluster")

// install makes m this node's map if its epoch is newer than the current
// one's: it is persisted first (a restart resumes from it), then
// published under the gate, then acted on (moves, cleanup, leaving,
// driving). It reports whether m was installed.
func (c *Coordinator) install(m *membership.Map) (bool, error) {
	c.installMu.Lock()
	cur := c.v()
	if m.Epoch <= cur.m.Epoch {
		c.installMu.Unlock()
		return false, nil
	}
	if m.Cluster != cur.m.Cluster {
		c.installMu.Unlock()
		return false, fmt.Errorf("%w: %016x, this node's is %016x", ErrOtherCluster, m.Cluster, cur.m.Cluster)
	}
	if cur.Moving && m.Change == nil {
		// A change ends: the partitions no longer held are dropped
		// (move.go), and a restart must finish that.
		if err := c.local.Store.SetCleanupPending(true); err != nil {
			c.installMu.Unlock()
			return false, err
		}
	}
	if err := c.local.Store.SetClusterMap(m.Encode()); err != nil {
		c.installMu.Unlock()
		return false, err
	}
	next := c.newView(m, cur.self)
	c.gate.Lock()
	c.view.Store(next)
	c.gate.Unlock()
	c.installMu.Unlock()
	c.m.epoch.Set(float64(m.Epoch))
	c.log.Info("cluster map installed", "map", m.String(), "was", cur.m.Epoch)
	c.afterInstall(next)
	return true, nil
}

// afterInstall starts what a new view asks of this node.
func (c *Coordinator) afterInstall(v *view) {
	if v.self < 0 {
		c.leave()
		return
	}
	c.ae.members(v)
	c.moves.update(v)
	if ch := v.m.Change; ch != nil && ch.Driver == v.self {
		c.driver.ensure()
	}
}

// onStale installs the map a peer refused a call with.
func (c *Coordinator) onStale(b []byte) {
	s, err := parseState(b)
	if err != nil {
		c.log.Warn("a peer refused a call as stale with a map that does not parse", "err", err)
		return
	}
	if err := c.fromMember(s); err != nil {
		c.log.Warn("a peer refused a call as stale", "err", err)
		return
	}
	if _, err := c.install(s.Map); err != nil {
		c.log.Warn("install a peer's newer cluster map", "err", err)
	}
}

// onBehind hands this node's map to a peer that answered with an older
// epoch, once per peer and epoch, in the background.
func (c *Coordinator) onBehind(url string, _ uint64) {
	v := c.v()
	c.pushMu.Lock()
	if c.pushed[url] >= v.m.Epoch {
		c.pushMu.Unlock()
		return
	}
	c.pushed[url] = v.m.Epoch
	c.pushMu.Unlock()
	p := c.peerFor(url)
	c.inflight.Add(1)
	go func() {
		defer c.inflight.Done()
		if _, err := p.client.Map(c.state(), time.Now().Add(c.summaryTimeout)); err != nil {
			c.log.Debug("hand the cluster map to a peer behind", "peer", url, "err", err)
			c.pushMu.Lock()
			delete(c.pushed, url) // try again at the next answer
			c.pushMu.Unlock()
		}
	}()
}

// CleanupPending reports whether this node still has partitions to drop
// after a membership change (move.go).
func (c *Coordinator) CleanupPending() bool {
	pending, err := c.local.Store.CleanupPending()
	return err != nil || pending
}

// Map returns the cluster map this node has installed, and this node's
// id in it (-1: it left the cluster).
func (c *Coordinator) Map() (*membership.Map, int) {
	v := c.v()
	return v.m, v.self
}

// installState is the coordinator's fields for maps; embedded in
// Coordinator.
type installState struct {
	view      atomic.Pointer[view]
	gate      sync.RWMutex // readers: admitted calls; writer: install
	installMu sync.Mutex   // one install at a time
	clientsMu sync.Mutex
	clients   map[string]*peer // by URL
	pushMu    sync.Mutex
	pushed    map[string]uint64 // the epoch last handed to a peer, by URL
}
