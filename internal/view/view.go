// Package view holds what every protocol of a node routes by: one cluster
// map's epoch as this node sees it (View: the map, this node's id in it,
// the replica sets, the peers), and the peer as the protocols reach it
// (Peer, the transport seam).
package view

import (
	"fmt"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/record"
)

// PingAnswer is what a peer says of itself in answer to a ping.
type PingAnswer struct {
	// Formed: it has seen every node of its cluster answer, or holds
	// records (package rebuild).
	Formed bool
	// Rebuilding: its replica is copying its share after a lost disk,
	// and refuses reads until done (package rebuild).
	Rebuilding bool
	// Incarnation names the peer's process: drawn at random when it
	// started, so it changes whenever the process does (0: a release
	// that does not say). A restarted node may hold other data than
	// before (a backup restored, a disk wiped), so what was learned of
	// its replica before is not trusted after (Synced).
	Incarnation uint64
	// FormedAt is when the peer first saw every node of its cluster
	// answer, by its clock (zero: not yet, or not said): a node that
	// started with an empty directory after it lost its disk (package
	// rebuild).
	FormedAt time.Time
	// Settings are the peer's settings that every node must share, as
	// "name=value" words ("": a release that does not say).
	Settings string
}

// Synced is when the last anti-entropy exchange with a peer that left
// nothing differing started, and the peer's incarnation before and after
// it (PingAnswer.Incarnation; 0 when the two differed or either was not
// known). What the exchange found the peer holding holds for as long as
// that incarnation runs: garbage collection trusts it only while the
// peer still answers with it.
type Synced struct {
	At          time.Time
	Incarnation uint64
}

// PingReply is one peer's answer to a ping (Peer.Ping), or its error.
type PingReply struct {
	Answer PingAnswer
	Err    error
}

// PingAll pings the peers of v with the ids given, all at once, each
// within timeout, and returns their replies in the order of ids: what a
// question asked of several peers waits for only as long as its slowest
// one. An id without a peer (this node, a non-member) replies an error.
func (v *View) PingAll(ids []int, timeout time.Duration) []PingReply {
	replies := make([]PingReply, len(ids))
	var wg sync.WaitGroup
	for k, id := range ids {
		p := v.Peers[id]
		if p == nil {
			replies[k].Err = fmt.Errorf("ping %s: not a peer", v.URL(id))
			continue
		}
		wg.Go(func() { replies[k].Answer, replies[k].Err = p.Ping(v.Epoch(), time.Now().Add(timeout)) })
	}
	wg.Wait()
	return replies
}

// Equal reports whether s and o are the same exchange.
func (s Synced) Equal(o Synced) bool { return s.At.Equal(o.At) && s.Incarnation == o.Incarnation }

// Peer is another node as this node's protocols reach it: the transport
// seam. *rpc.Peer implements it over HTTP; tests put other
// implementations behind it. Every call ends by its deadline; one routed
// by a map older than the peer's fails with rpc.ErrStaleEpoch (the epoch
// is the routing map's; 0, a tool's call, is not checked).
type Peer interface {
	// Get reads key's record from the peer's replica.
	Get(key []byte, epoch uint64, deadline time.Time) (rec record.Record, found bool, err error)
	// Apply writes the encoded record env under key to the peer's
	// replica; newer is the version the peer holds above it (the write
	// was then not applied), 0 when it was applied.
	Apply(key, env []byte, epoch uint64, deadline time.Time) (newer uint64, err error)
	// Ping sends an empty batch: whether the peer answers, and what it
	// says of itself (PingAnswer).
	Ping(epoch uint64, deadline time.Time) (PingAnswer, error)
	// Summary exchanges an anti-entropy summary request for its answer.
	Summary(body []byte, epoch uint64, deadline time.Time) ([]byte, error)
	// Map offers the peer a map state (nil: only asks) and returns the
	// peer's.
	Map(offer []byte, deadline time.Time) ([]byte, error)
	// Reach asks the peer whether the member at url answers it (its own
	// ping): before a node is counted dead, every member is asked.
	Reach(url string, deadline time.Time) (answers bool, err error)
	// ClockOffset is the last measurement of the peer's clock against
	// this node's; ok is false before any.
	ClockOffset() (s ClockSample, ok bool)
	// Close releases the transport's connections.
	Close()
}

// ClockSample is one measurement of a peer's clock against this node's
// (the clock its versions are made from), read off an exchange's answer.
type ClockSample struct {
	// Offset is how far the peer's clock was ahead of this node's.
	Offset time.Duration
	// Error bounds how far Offset may be from the truth: half the
	// exchange's round trip (the peer read its clock somewhere within
	// it, and Offset takes the midpoint).
	Error time.Duration
	// At is when it was measured, by this process's time.Now (not this
	// node's clock, which may be the one off).
	At time.Time
	// Wall is this node's clock (the one Offset is against) as the
	// answer came, without a monotonic reading: set apart from At, it
	// says whether this clock stepped between two moments (a probe
	// round's start and the sample). Zero: not known.
	Wall time.Time
	// WallErr is how far from At's instant Wall may have been read (a
	// goroutine descheduled between the two readings).
	WallErr time.Duration
}

// View is this node's picture of the cluster at one epoch. It is
// immutable: a request or a protocol step loads the current one once and
// routes by it from start to end, and the calls it makes carry its epoch,
// so that a peer with a newer map refuses them.
type View struct {
	Map *clustermap.Map
	// Self is this node's id; -1 once the map no longer has it
	// (decommissioned, or its id given to a replacement).
	Self int
	// The replica sets before and after the change under way, and which
	// of them requests use at the map's stage.
	*placement.Sets
	// Peers are the other members' transports, by node id: nil for this
	// node and for ids the map does not have.
	Peers []Peer
	// Since is when this node installed the view.
	Since time.Time
}

// New derives the view of m for the node with id self, reached at selfURL
// (""; any URL), installed at now. peer returns the transport of the
// member at a URL. A map in which self is reached at another URL gave the
// id to a replacement: this node is then out (Self -1) as surely as if it
// had been decommissioned, since two nodes must never make versions with
// one id.
func New(m *clustermap.Map, self int, selfURL string, peer func(url string) Peer, now time.Time) *View {
	v := &View{Map: m, Self: -1, Sets: placement.Of(m), Peers: make([]Peer, clustermap.MaxNodeID+1), Since: now}
	if n := m.Node(self); n != nil && (selfURL == "" || n.URL == selfURL) {
		v.Self = self
	}
	for _, n := range m.Nodes {
		if n.ID != self {
			v.Peers[n.ID] = peer(n.URL)
		}
	}
	return v
}

// Epoch is the map's epoch, which every call routed by the view carries.
func (v *View) Epoch() uint64 { return v.Map.Epoch }

// URL names node id for logs, metrics and errors.
func (v *View) URL(id int) string {
	if n := v.Map.Node(id); n != nil {
		return n.URL
	}
	return fmt.Sprintf("node %d (no longer a member)", id)
}

// Dead reports whether node id is a member the map counts dead
// (clustermap.Map.Dead: the leaving node of a remove, or one to be
// removed after the change under way): nothing waits for it, and nothing
// is copied from it.
func (v *View) Dead(id int) bool {
	return v.Map.Dead(id)
}

// Others returns the ids of every member but this node.
func (v *View) Others() []int {
	out := make([]int, 0, len(v.Map.Nodes))
	for _, n := range v.Map.Nodes {
		if n.ID != v.Self {
			out = append(out, n.ID)
		}
	}
	return out
}
