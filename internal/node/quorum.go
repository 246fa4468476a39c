package node

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/view"
)

// ErrNoQuorum: the node cannot reach a quorum of some partition's
// replicas, so requests at the default ack (a majority of the replication
// factor) for the keys of that partition fail, whichever node coordinates
// them; /readyz then answers 503 so that a load balancer takes the node
// out of its pool, and /v0/status says which replicas are missing.
var ErrNoQuorum = errors.New("cannot reach a quorum of replicas")

// quorumProblem says which partitions this node cannot serve at the
// default ack, and why, or "" when it can serve every one. A replica
// counts as reachable when it is this node and its replica is not
// rebuilding, or a peer whose last probe did not fail and did not say it
// rebuilds (it answers pings while refusing every read): a peer no probe
// has ended for since this node started counts (its first probe ends
// within --probe-interval and timeout), so that a node does not flap to
// not-ready at every start of a healthy cluster.
// The replica sets are those reads use, as they decide what a client
// sees; the default ack is a majority of the replication factor (during a
// replicas change, of the larger one, cut to the read set's).
func (n *Node) quorumProblem() string {
	v := n.members.View()
	if v == nil || v.Self < 0 {
		return ""
	}
	r := n.reach(v, true)
	if r.allUp() { // the common case, without a pass over the partitions
		return ""
	}
	sets := v.Old
	if v.ReadNew {
		sets = v.New
	}
	// The read set's factor, and a read's default ack (httpapi's
	// parseReplication): a majority of the larger factor, cut to the read
	// set's. They differ in a replicas change: growing 3 to 4, a default
	// read needs all three old replicas until read-new.
	factor := v.ReadFactor()
	need := min(v.Replicas/2+1, factor)
	short := 0
	var buf [16]int
	for part := range partition.ID(partition.Count) {
		if r.count(sets.PartitionReplicas(part, factor, buf[:0])) < need {
			short++
		}
	}
	if short == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d partitions have fewer than %d of their %d replicas reachable from here (unreachable: %s): requests at the default ack fail for their keys",
		short, partition.Count, need, factor, r.missingURLs())
}

// writeProblem says, while a change under way makes writes go to both
// replica sets, for how many partitions a write at the default ack (a
// majority of the larger factor: cluster.fanOut needs that many of each
// set, or every replica of a smaller one) cannot reach its need in one of
// the sets from here, and which nodes are missing; "" when none. A node
// whose join was asked before it was started is such a node: it is in
// the new set of the partitions it gains from write-both on, so at a
// factor of 1 or 2 (or with another replica down) writes of their keys
// fail until it answers, or the change is aborted. Reads are not
// affected before read-new (quorumProblem), so /readyz does not count it;
// /v0/status warns.
func (n *Node) writeProblem() string {
	v := n.members.View()
	if v == nil || v.Self < 0 || !v.Moving {
		return ""
	}
	r := n.reach(v, false)
	if r.allUp() {
		return ""
	}
	ack := v.Replicas/2 + 1
	short := 0
	var oldBuf, newBuf [16]int
	for part := range partition.ID(partition.Count) {
		old := v.Old.PartitionReplicas(part, v.OldFactor, oldBuf[:0])
		nw := v.New.PartitionReplicas(part, v.NewFactor, newBuf[:0])
		if r.count(old) < min(ack, len(old)) || r.count(nw) < min(ack, len(nw)) {
			short++
		}
	}
	if short == 0 {
		return ""
	}
	ch := v.Map.Change
	remedy := "start or bring them back, replace or remove a dead one, or abort the change (dhtkvctl abort)"
	if v.ReadNew {
		remedy = "start or bring them back, or replace or remove a dead one (past read-new the change cannot be aborted)"
	}
	// A replicas change moves no node (its node is the driver); a node is
	// named with its URL too: ids are the map's, not the operator's numbering.
	what := fmt.Sprintf("change of the replication factor to %d", ch.Replicas)
	if ch.Kind != clustermap.Replicas {
		what = fmt.Sprintf("%s of node %d", ch.Kind, ch.Node)
		if nd := v.Map.Node(ch.Node); nd != nil {
			what += " at " + nd.URL
		}
	}
	return fmt.Sprintf("%d of %d partitions cannot take writes at the default ack while the %s (stage %s) writes both replica sets: unreachable from here: %s; %s",
		short, partition.Count, what, ch.Stage, r.missingURLs(), remedy)
}

// reach tells the replicas this node reaches from those it does not, by
// its probe's last word (a peer no probe has ended for yet counts), and
// remembers the latter.
type reach struct {
	v       *view.View
	up      func(id int) bool
	missing []int
}

// reach is v's reach from this node; rebuilding: a rebuilding replica
// (this node's or a peer's) counts as not reached, as for reads, whose
// rebuilding replicas refuse them (writes it takes).
func (n *Node) reach(v *view.View, rebuilding bool) *reach {
	reachable := map[string]bool{}
	for _, st := range n.probe.PeerStates() {
		reachable[st.URL] = !st.Probed || st.Reachable && !(rebuilding && st.Rebuilding)
	}
	return &reach{v: v, up: func(id int) bool {
		if id == v.Self {
			return !rebuilding || !n.rebuild.Rebuilding()
		}
		m := v.Map.Node(id)
		return m != nil && reachable[m.URL]
	}}
}

// allUp reports whether every node of the map is reached.
func (r *reach) allUp() bool {
	for _, m := range r.v.Map.Nodes {
		if !r.up(m.ID) {
			return false
		}
	}
	return true
}

// count is how many of reps are reached; it remembers the others.
func (r *reach) count(reps []int) int {
	ok := 0
	for _, id := range reps {
		if r.up(id) {
			ok++
		} else if !slices.Contains(r.missing, id) {
			r.missing = append(r.missing, id)
		}
	}
	return ok
}

// missingURLs are the URLs of the replicas count found not reached.
func (r *reach) missingURLs() string {
	urls := make([]string, 0, len(r.missing))
	for _, id := range r.missing {
		if m := r.v.Map.Node(id); m != nil {
			urls = append(urls, m.URL)
		}
	}
	return strings.Join(urls, ", ")
}
