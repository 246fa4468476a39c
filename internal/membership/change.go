package membership

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/view"
)

// Membership changes, asked of any member (Join, Decommission,
// SetReplicas, Replace, Remove; Abort in logged.go): each is a command of the
// cluster map's log (Options.Log), made from the log's current epoch and
// answered with the log's real outcome (logged.go). The log takes the
// change through its stages (clustermap.Stage), one map epoch each, once
// every member acknowledged the current one; the service installs and
// acknowledges every map the log applies (follow).

func stageName(m *clustermap.Map) string {
	if m.Change == nil {
		return "done"
	}
	return string(m.Change.Stage)
}

// ErrChangeRefused is a membership change that cannot begin; the error
// says why.
var ErrChangeRefused = errors.New("membership change refused")

// Join begins adding the node at url (http://host:port), which is then
// started with --join naming a member (before or after this call): it
// takes its share of partitions, copied from their replicas, while the
// cluster serves. It returns the change's first map; ChangeStatus tells
// how it goes.
//
// On the map's log the new node needs no log address: the log rides its
// node port, and the group reaches it at its URL's host:port
// (maplog.Options.AddrFromURL).
func (s *Service) Join(url string) (*clustermap.Map, error) {
	m, err := s.logMap()
	if err != nil {
		return nil, err
	}
	if err := notMemberByHost(m, url); err != nil {
		return nil, err
	}
	return s.submit(maplog.Command{Op: maplog.OpJoin, Epoch: m.Epoch, URL: url})
}

// notMemberByHost refuses a new node URL that names a member's machine
// with its host spelled in other letters (host names ignore case, the
// map's URLs are compared as text): the log would take it as a new node.
// The requester's check, not a rule of the log, so that every release
// applies the log alike.
func notMemberByHost(m *clustermap.Map, url string) error {
	u, err := clustermap.NormalizeURL(url)
	if err != nil {
		return nil // the log refuses it with the reason
	}
	for _, n := range m.Nodes {
		if n.URL != u && strings.EqualFold(n.URL, u) {
			return fmt.Errorf("%w: %s is already a member, as node %d at %s (host names ignore case)", ErrChangeRefused, u, n.ID, n.URL)
		}
	}
	return nil
}

// Decommission begins removing the node at url: its partitions are
// copied to the nodes that take them, then it drops out of the map and
// stops.
//
// Unless force, it is refused when it would leave fewer nodes than the
// replication factor, as a remove is and as Cassandra refuses such a
// decommission: the nodes left would each hold every partition, and
// requests at the default ack (a majority of the nodes left, then all of
// them with two) would fail while any one of them is down, where at the
// factor they did not. Lowering the factor first says so in the map.
// The check is on the map the command is made from: the log applies the
// command only at that map's epoch, so no change in between can make it
// wrong.
func (s *Service) Decommission(url string, force bool) (*clustermap.Map, error) {
	m, err := s.logMap()
	if err != nil {
		return nil, err
	}
	n, err := memberOf(m, url)
	if err != nil {
		return nil, err
	}
	if left := len(m.Nodes) - 1; !force && left >= 1 && left < m.Replicas {
		return nil, fmt.Errorf("%w: decommissioning node %d would leave %d nodes, fewer than the replication factor %d: each would hold every partition, "+
			"and one node down would fail requests at the default ack; lower the factor first (dhtkvctl replicas %d), or force it (force=true, dhtkvctl decommission --force)",
			ErrChangeRefused, n.ID, left, m.Replicas, left)
	}
	return s.submit(maplog.Command{Op: maplog.OpDecommission, Epoch: m.Epoch, Node: n.ID})
}

// SetReplicas begins changing the replication factor to n (from 1 to the
// number of nodes, not the current one) over the same nodes: in the
// stream stage each node copies the partitions it gains (growing: those
// of which it is the newly counted replica), writes reach both sets
// meanwhile, and at the end each node drops the partitions it no longer
// holds (shrinking). It goes through the stages of a join
// (clustermap.Stage), driven by this node, or with a log by its
// members' acknowledgements.
func (s *Service) SetReplicas(n int) (*clustermap.Map, error) {
	m, err := s.logMap()
	if err != nil {
		return nil, err
	}
	return s.submit(maplog.Command{Op: maplog.OpReplicas, Epoch: m.Epoch, Replicas: n})
}

// Replace makes a new, empty machine at newURL take the identity of the
// dead node at oldURL: the map then names newURL for it, and the new
// machine, started with --join, rebuilds the node's data from the other
// replicas before serving reads (package rebuild). A node that answers is not
// replaced: decommission it instead.
//
// A dead member of a change under way is replaced too, at any stage: the
// change stays at its stage and waits for the new machine, which
// acknowledges it only once it rebuilt its partitions of both sets
// (logged.go, followOnce; docs/membership.md, "A member that dies during
// a change").
func (s *Service) Replace(oldURL, newURL string) (*clustermap.Map, error) {
	m, n, err := s.deadMember(oldURL, "replaced")
	if err != nil {
		return nil, err
	}
	if err := notMemberByHost(m, newURL); err != nil {
		return nil, err
	}
	return s.submit(maplog.Command{Op: maplog.OpReplace, Epoch: m.Epoch, Node: n.ID, URL: newURL})
}

// Remove begins removing the dead node at url, whose machine will not
// come back: a decommission that waits for nothing from it (clustermap.Map.Remove).
// The nodes that gain its partitions copy them from the other replicas
// of the old set, and at the end it leaves the map. A node that answers
// is not removed: decommission it instead. During the decommission of
// that very node it marks it dead, and the change finishes without it;
// during any other change it counts the node dead there, and the log
// removes it once that change is over (clustermap.Map.Removing).
// docs/membership.md, "Removing a dead member".
func (s *Service) Remove(url string) (*clustermap.Map, error) {
	m, n, err := s.deadMember(url, "removed")
	if err != nil {
		return nil, err
	}
	return s.submit(maplog.Command{Op: maplog.OpRemove, Epoch: m.Epoch, Node: n.ID})
}

// deadMember finds the member at url that a replace or a remove (verb:
// "replaced", "removed") is asked for, and checks that it is dead: not
// this node, and neither this node nor any other member reaches it
// (reachedBy): a node cut off from this one alone is alive, and counted
// dead it would be replaced while it still serves (two machines making
// versions with one id until it learns the map) or removed for nothing.
// It returns the log's map to make the change from: with no change under
// way, the log's rules refuse it unless every other member acknowledged
// that map.
func (s *Service) deadMember(url, verb string) (*clustermap.Map, *clustermap.Node, error) {
	v := s.View()
	if v.Self < 0 {
		return nil, nil, fmt.Errorf("%w: this node is no longer a member of the cluster map: ask a member", ErrChangeRefused)
	}
	n, err := s.member(v, url)
	if err != nil {
		return nil, nil, err
	}
	if n.ID == v.Self {
		return nil, nil, fmt.Errorf("%w: this node is %s and answers: ask another member", ErrChangeRefused, n.URL)
	}
	if ok, refusal := s.answers(v, n); ok {
		how := ""
		if refusal != nil {
			how = fmt.Sprintf(" (and refuses this node: %v)", refusal)
		}
		return nil, nil, fmt.Errorf("%w: %s answers%s; only a dead node is %s (decommission a live one)", ErrChangeRefused, n.URL, how, verb)
	}
	if by := s.reachedBy(v, n); by != "" {
		return nil, nil, fmt.Errorf("%w: %s answers %s though not this node (a cut link, not a dead node); only a dead node is %s", ErrChangeRefused, n.URL, by, verb)
	}
	m, err := s.logMap()
	if err != nil {
		return nil, nil, err
	}
	ln, err := memberOf(m, url)
	if err != nil {
		return nil, nil, err
	}
	if ln.ID != n.ID {
		// The URL rejoined under a new id that this node has not
		// installed: its liveness was asked of the old id's machine.
		return nil, nil, fmt.Errorf("%w: %s is node %d in the log's map and node %d in the map this node installed: try again once it installed the log's map",
			ErrChangeRefused, url, ln.ID, n.ID)
	}
	if w := unloggedDrivers(s.o.Log.State(), m, n.ID); len(w) > 0 {
		return nil, nil, fmt.Errorf("%w: the change under way in %s was begun before the log and nodes %v have not acknowledged it through the log: "+
			"a node of a release without the log may still drive it, and would make another map of the epoch this change makes; "+
			"upgrade them (or bring them back) first (docs/membership.md, \"Upgrading to the log\")", ErrChangeRefused, m, w)
	}
	return m, ln, nil
}

// unloggedDrivers returns the members of m but skip, not counted dead,
// that have not acknowledged m through the log, when m is a seed's map
// with a change under way that the log has not changed (st.Changed):
// during a rolling upgrade from a release without the log, those members
// may run the old release, whose driver goes on advancing the change and
// knows nothing of the log. A replace or a remove during that change
// (the FSM accepts both at a change's stage) would make a map of the
// epoch the old driver's next stage makes too: two maps of one epoch.
// The log's abort waits for the same (maplog's OpAbort). Once every
// member acknowledged through the log, every one runs it and the log
// drives the change. It is the requester's check, not the log's rule, so
// that members of releases with and without it apply the log alike.
func unloggedDrivers(st *maplog.State, m *clustermap.Map, skip int) []int {
	if st == nil || st.Map == nil || st.Map.Epoch != m.Epoch || m.Change == nil || st.Changed {
		return nil
	}
	var out []int
	for _, node := range m.Nodes {
		if node.ID != skip && !m.Dead(node.ID) && st.Acks[node.ID] < m.Epoch {
			out = append(out, node.ID)
		}
	}
	return out
}

// answers reports whether member n (not this node) answers a ping
// within Timeout, whatever it answers (rpc.Answered): a node that refuses
// this one, for a newer map, a cluster secret or a CA that differ, is
// alive, and refusal is its answer then.
func (s *Service) answers(v *view.View, n *clustermap.Node) (ok bool, refusal error) {
	p := v.Peers[n.ID]
	if p == nil {
		// n is this node's own old id, given to another URL (this node
		// was replaced while it runs): nothing to ask.
		return false, nil
	}
	_, err := p.Ping(v.Map.Epoch, time.Now().Add(s.o.Timeout))
	return rpc.Answered(err), err
}

// reachedBy asks every other member at once whether dead answers it
// (view.Peer.Reach) and returns the URL of one that it answers, or "". A
// member that does not answer the question (down too, cut off from this
// node, or of a release without it) cannot vouch either way and is not
// waited for: two dead members must each be replaceable while the other
// is down.
func (s *Service) reachedBy(v *view.View, dead *clustermap.Node) string {
	deadline := time.Now().Add(2 * s.o.Timeout) // the member's own ping, and the way there and back
	answers := make(chan string, len(v.Map.Nodes))
	asked := 0
	for _, m := range v.Map.Nodes {
		if m.ID == v.Self || m.ID == dead.ID || v.Peers[m.ID] == nil {
			continue
		}
		asked++
		go func() {
			ok, err := v.Peers[m.ID].Reach(dead.URL, deadline)
			if err != nil {
				s.log.Debug("membership: a member did not say whether it reaches a node asked dead", "member", m.URL, "node", dead.URL, "err", err)
			}
			if ok {
				answers <- m.URL
			} else {
				answers <- ""
			}
		}()
	}
	by := ""
	for range asked {
		if u := <-answers; u != "" && by == "" {
			by = u
		}
	}
	return by
}

func (s *Service) member(v *view.View, url string) (*clustermap.Node, error) {
	return memberOf(v.Map, url)
}

func memberOf(m *clustermap.Map, url string) (*clustermap.Node, error) {
	u, err := clustermap.NormalizeURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	n := m.ByURL(u)
	if n == nil {
		return nil, fmt.Errorf("%w: %s is not a member", ErrChangeRefused, u)
	}
	return n, nil
}

// ChangeStatus is the cluster map as this node has it, and what the
// log's change (if any) waits for.
type ChangeStatus struct {
	Map    *clustermap.Map `json:"map"`
	Self   int             `json:"self"`
	Moved  uint64          `json:"moved"`
	Driver string          `json:"driver,omitempty"` // what the log waits for, in words
	// The members whose acknowledgement (or copy
	// report) the log's next step waits for (maplog.State.Waiting), and
	// how the last change ended.
	Waiting []int           `json:"waiting,omitempty"`
	Last    *maplog.Outcome `json:"last,omitempty"`
	// LogEpoch is the epoch of the map this node's replica of the log
	// holds (0: none yet); behind Map's while the replica lags.
	LogEpoch uint64 `json:"log_epoch,omitempty"`
}

// ChangeStatus returns the installed map and what the log waits for.
func (s *Service) ChangeStatus() ChangeStatus {
	v := s.View()
	st := s.o.Log.State()
	cs := ChangeStatus{Map: v.Map, Self: v.Self, Moved: s.moved.Load(), Waiting: st.Waiting(-1), Last: st.Last}
	if st.Map != nil {
		cs.LogEpoch = st.Map.Epoch
	}
	if st.Map != nil && (st.Map.Change != nil || len(cs.Waiting) > 0) {
		cs.Driver = fmt.Sprintf("log at epoch %d (%s): waiting for nodes %v to acknowledge it", st.Map.Epoch, stageName(st.Map), cs.Waiting)
	}
	return cs
}
