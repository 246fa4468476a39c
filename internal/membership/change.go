package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/view"
)

// Membership changes without the map's log (docs/membership.md; with
// Options.Log, logged.go replaces the driver, agree and begin)
//
// A change is begun on one node, its driver, which takes it through its
// stages (clustermap.Stage), one map epoch each:
//
//  1. the driver installs the next stage's map and hands it to every
//     node of the map until each has installed it (barrier): no node is
//     then two stages behind, and no call routed by an older stage is
//     served any more (rpc/epoch.go);
//  2. in the stream stage it also waits for every node gaining
//     partitions to report them copied (mover);
//  3. it advances to the next stage.
//
// The stage is in the map every node persists, so a driver that restarts
// resumes where it was (Start calls afterInstall), and a node
// that restarts in the stream stage copies again.
//
// Only one change runs at a time: a change is begun only when every
// member answers with this node's epoch and no change under way. Two
// operators beginning changes on two nodes within the same moment are not
// told apart (the map has no consensus behind it): run changes one at a
// time, or on the map's log.

// driver runs the change this node began, if any.
type driver struct {
	s       *Service
	mu      sync.Mutex
	running bool
	status  string // what it waits for now, for ChangeStatus
	ctx     context.Context
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func newDriver(s *Service) *driver {
	ctx, cancel := context.WithCancel(context.Background())
	return &driver{s: s, ctx: ctx, cancel: cancel}
}

// barrierRetry is the wait between rounds of handing a map to the nodes
// that have not installed it yet.
const barrierRetry = 500 * time.Millisecond

// ensure runs the driver unless it runs already.
func (d *driver) ensure() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running || d.ctx.Err() != nil {
		return
	}
	d.running = true
	d.done.Add(1)
	go func() {
		defer d.done.Done()
		d.run()
		d.mu.Lock()
		d.running = false
		d.mu.Unlock()
	}()
}

func (d *driver) close() {
	d.cancel()
	d.done.Wait()
}

func (d *driver) setStatus(format string, args ...any) {
	d.mu.Lock()
	d.status = fmt.Sprintf(format, args...)
	d.mu.Unlock()
}

// run takes the change through its stages (see the top of the file).
func (d *driver) run() {
	s := d.s
	for d.ctx.Err() == nil {
		v := s.View()
		ch := v.Map.Change
		if ch == nil || ch.Driver != v.Self {
			return
		}
		if !d.barrier(v.Map, v.Map.Nodes) {
			return
		}
		if ch.Stage == clustermap.Stream && !d.awaitMoved(v) {
			return
		}
		next, err := v.Map.Advance()
		if err != nil {
			s.log.Error("membership: advance the change", "err", err)
			return
		}
		if _, err := s.install(next); err != nil {
			s.log.Error("membership: install the next stage; trying again", "err", err)
			select {
			case <-d.ctx.Done():
			case <-time.After(barrierRetry):
			}
			continue
		}
		if next.Change == nil {
			// Hand the last map to the members, and to a node that left,
			// which learns from it that it is out and stops.
			nodes := next.Nodes
			if ch.Kind == clustermap.Decommission {
				if n := v.Map.Node(ch.Node); n != nil {
					d.handOnce(next, *n)
				}
			}
			if d.barrier(next, nodes) {
				d.setStatus("done: %s", next)
				s.log.Info("membership: change complete", "kind", ch.Kind, "node", v.URL(ch.Node), "replicas", next.Replicas, "map", next.String())
			}
			return
		}
	}
}

// barrier hands m to every node of nodes until each has installed it (or
// a newer one). It returns false when the driver stops first.
func (d *driver) barrier(m *clustermap.Map, nodes []clustermap.Node) bool {
	s := d.s
	state := s.State()
	pending := map[int]clustermap.Node{}
	for _, n := range nodes {
		if n.ID != s.View().Self {
			pending[n.ID] = n
		}
	}
	started := time.Now()
	lastLog := started
	for len(pending) > 0 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		round := make(map[int]clustermap.Node, len(pending))
		maps.Copy(round, pending)
		for id, n := range round {
			wg.Go(func() {
				ans, err := s.peer(n.URL).Map(state, time.Now().Add(s.o.Timeout+time.Second))
				if err == nil {
					var st State
					if st, err = ParseState(ans); err == nil && st.Map.Epoch >= m.Epoch {
						mu.Lock()
						delete(pending, id)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if len(pending) == 0 {
			break
		}
		var waiting []string
		for _, n := range pending {
			waiting = append(waiting, n.URL)
		}
		slices.Sort(waiting)
		d.setStatus("epoch %d (%s): waiting for %s to install it", m.Epoch, stageName(m), strings.Join(waiting, ", "))
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			s.log.Warn("membership: waiting for nodes to install the cluster map", "epoch", m.Epoch, "nodes", waiting, "for", time.Since(started).Round(time.Second))
		}
		select {
		case <-d.ctx.Done():
			return false
		case <-time.After(barrierRetry):
		}
	}
	return true
}

// handOnce offers m to node n, a few times at most: a node leaving the
// cluster, which may already have stopped.
func (d *driver) handOnce(m *clustermap.Map, n clustermap.Node) {
	state := d.s.State()
	for range 3 {
		if _, err := d.s.peer(n.URL).Map(state, time.Now().Add(d.s.o.Timeout+time.Second)); err == nil {
			return
		}
		select {
		case <-d.ctx.Done():
			return
		case <-time.After(barrierRetry):
		}
	}
}

// awaitMoved waits until every node gaining partitions in v's change has
// copied them (its State.Moved reaches v's epoch).
func (d *driver) awaitMoved(v *view.View) bool {
	s := d.s
	pending := map[int]bool{}
	for _, n := range v.Gainers() {
		pending[n] = true
	}
	for len(pending) > 0 {
		for n := range pending {
			if n == v.Self {
				if s.moved.Load() >= v.Map.Epoch {
					delete(pending, n)
				}
				continue
			}
			ans, err := v.Peers[n].Map(nil, time.Now().Add(s.o.Timeout+time.Second))
			if err != nil {
				continue
			}
			if st, err := ParseState(ans); err == nil && st.Moved >= v.Map.Epoch {
				delete(pending, n)
			}
		}
		if len(pending) == 0 {
			break
		}
		var waiting []string
		for n := range pending {
			waiting = append(waiting, v.URL(n))
		}
		slices.Sort(waiting)
		d.setStatus("epoch %d (stream): waiting for %s to copy the partitions they gain", v.Map.Epoch, strings.Join(waiting, ", "))
		select {
		case <-d.ctx.Done():
			return false
		case <-time.After(barrierRetry):
		}
	}
	return true
}

func stageName(m *clustermap.Map) string {
	if m.Change == nil {
		return "done"
	}
	return string(m.Change.Stage)
}

// ErrChangeRefused is a membership change that cannot begin; the error
// says why.
var ErrChangeRefused = errors.New("membership change refused")

// agree checks that every member answers with this node's map and no
// change under way: what beginning a change requires.
func (s *Service) agree(v *view.View, except int) error {
	if v.Map.Change != nil {
		return fmt.Errorf("%w: %w: %s", ErrChangeRefused, clustermap.ErrBusy, v.Map)
	}
	for _, id := range v.Others() {
		if id == except {
			continue
		}
		ans, err := v.Peers[id].Map(nil, time.Now().Add(s.o.Timeout+time.Second))
		if err != nil {
			return fmt.Errorf("%w: %s does not answer (every member must, but the one replaced): %w", ErrChangeRefused, v.URL(id), err)
		}
		st, err := ParseState(ans)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrChangeRefused, v.URL(id), err)
		}
		if st.Map.Epoch != v.Map.Epoch || st.Map.Change != nil {
			return fmt.Errorf("%w: %s is at %s, this node at %s: try again once they agree", ErrChangeRefused, v.URL(id), st.Map, v.Map)
		}
	}
	return nil
}

// begin installs m, the first map of a change begun here, which starts
// the driver.
func (s *Service) begin(v *view.View, m *clustermap.Map) (*clustermap.Map, error) {
	ok, err := s.install(m)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: the map changed meanwhile (now %s)", ErrChangeRefused, s.View().Map)
	}
	s.log.Info("membership: change begun", "map", m.String(), "was", v.Map.Epoch)
	return m, nil
}

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
	if s.o.Log != nil {
		m, err := s.logMap()
		if err != nil {
			return nil, err
		}
		return s.submit(maplog.Command{Op: maplog.OpJoin, Epoch: m.Epoch, URL: url})
	}
	v := s.View()
	if err := s.agree(v, -1); err != nil {
		return nil, err
	}
	m, err := v.Map.BeginJoin(url, v.Self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return s.begin(v, m)
}

// Decommission begins removing the node at url: its partitions are
// copied to the nodes that take them, then it drops out of the map and
// stops.
func (s *Service) Decommission(url string) (*clustermap.Map, error) {
	v := s.View()
	if s.o.Log != nil {
		m, err := s.logMap()
		if err != nil {
			return nil, err
		}
		n, err := memberOf(m, url)
		if err != nil {
			return nil, err
		}
		return s.submit(maplog.Command{Op: maplog.OpDecommission, Epoch: m.Epoch, Node: n.ID})
	}
	n, err := s.member(v, url)
	if err != nil {
		return nil, err
	}
	if err := s.agree(v, -1); err != nil {
		return nil, err
	}
	m, err := v.Map.BeginDecommission(n.ID, v.Self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return s.begin(v, m)
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
	if s.o.Log != nil {
		m, err := s.logMap()
		if err != nil {
			return nil, err
		}
		return s.submit(maplog.Command{Op: maplog.OpReplicas, Epoch: m.Epoch, Replicas: n})
	}
	v := s.View()
	if err := s.agree(v, -1); err != nil {
		return nil, err
	}
	m, err := v.Map.BeginReplicas(n, v.Self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return s.begin(v, m)
}

// Replace makes a new, empty machine at newURL take the identity of the
// dead node at oldURL: the map then names newURL for it, and the new
// machine, started with --join, rebuilds the node's data from the other
// replicas before serving reads (package rebuild). A node that answers is not
// replaced: decommission it instead.
func (s *Service) Replace(oldURL, newURL string) (*clustermap.Map, error) {
	v := s.View()
	n, err := s.member(v, oldURL)
	if err != nil {
		return nil, err
	}
	if n.ID == v.Self {
		return nil, fmt.Errorf("%w: this node is %s and answers: ask another member", ErrChangeRefused, n.URL)
	}
	if _, err := v.Peers[n.ID].Ping(v.Map.Epoch, time.Now().Add(s.o.Timeout)); err == nil {
		return nil, fmt.Errorf("%w: %s answers; only a dead node is replaced (decommission a live one)", ErrChangeRefused, n.URL)
	}
	if s.o.Log != nil {
		// The log's rules refuse a replace unless every other member
		// acknowledged the current map, as agree does below.
		m, err := s.logMap()
		if err != nil {
			return nil, err
		}
		if _, err := memberOf(m, oldURL); err != nil {
			return nil, err
		}
		return s.submit(maplog.Command{Op: maplog.OpReplace, Epoch: m.Epoch, Node: n.ID, URL: newURL})
	}
	if err := s.agree(v, n.ID); err != nil {
		return nil, err
	}
	m, err := v.Map.Replace(n.ID, newURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	if _, err := s.begin(v, m); err != nil {
		return nil, err
	}
	// No stages: hand the map to the others now (the new machine fetches
	// it when it starts).
	others := slices.DeleteFunc(slices.Clone(m.Nodes), func(x clustermap.Node) bool { return x.ID == n.ID })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &driver{s: s, ctx: ctx}
	d.barrier(m, others)
	return m, nil
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
// change it drives (if any) waits for.
type ChangeStatus struct {
	Map    *clustermap.Map `json:"map"`
	Self   int             `json:"self"`
	Moved  uint64          `json:"moved"`
	Driver string          `json:"driver,omitempty"` // this node's driver's last status
	// With the map's log: the members whose acknowledgement (or copy
	// report) the log's next step waits for (maplog.State.Waiting), and
	// how the last change ended.
	Waiting []int           `json:"waiting,omitempty"`
	Last    *maplog.Outcome `json:"last,omitempty"`
	// LogEpoch is the epoch of the map this node's replica of the log
	// holds (0: none yet); behind Map's while the replica lags.
	LogEpoch uint64 `json:"log_epoch,omitempty"`
}

// ChangeStatus returns the map and the driver's status, or, with a log,
// what the log waits for.
func (s *Service) ChangeStatus() ChangeStatus {
	v := s.View()
	if s.o.Log != nil {
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
	s.driver.mu.Lock()
	st := s.driver.status
	s.driver.mu.Unlock()
	return ChangeStatus{Map: v.Map, Self: v.Self, Moved: s.moved.Load(), Driver: st}
}
