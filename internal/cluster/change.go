package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/membership"
)

// Membership changes (docs/membership.md)
//
// A change is begun on one node, its driver, which takes it through its
// stages (membership.Stage), one map epoch each:
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
// resumes where it was (NewCoordinator calls afterInstall), and a node
// that restarts in the stream stage copies again.
//
// Only one change runs at a time: a change is begun only when every
// member answers with this node's epoch and no change under way. Two
// operators beginning changes on two nodes within the same moment are not
// told apart (the map has no consensus behind it): run changes one at a
// time.

// driver runs the change this node began, if any.
type driver struct {
	c       *Coordinator
	mu      sync.Mutex
	running bool
	status  string // what it waits for now, for ChangeStatus
	ctx     context.Context
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func newDriver(c *Coordinator) *driver {
	ctx, cancel := context.WithCancel(context.Background())
	return &driver{c: c, ctx: ctx, cancel: cancel}
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
	c := d.c
	for d.ctx.Err() == nil {
		v := c.v()
		ch := v.m.Change
		if ch == nil || ch.Driver != v.self {
			return
		}
		if !d.barrier(v.m, v.m.Nodes) {
			return
		}
		if ch.Stage == membership.Stream && !d.awaitMoved(v) {
			return
		}
		next, err := v.m.Advance()
		if err != nil {
			c.log.Error("membership: advance the change", "err", err)
			return
		}
		if _, err := c.install(next); err != nil {
			c.log.Error("membership: install the next stage; trying again", "err", err)
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
			if ch.Kind == membership.Decommission {
				if n := v.m.Node(ch.Node); n != nil {
					d.handOnce(next, *n)
				}
			}
			if d.barrier(next, nodes) {
				d.setStatus("done: %s", next)
				c.log.Info("membership: change complete", "kind", ch.Kind, "node", v.url(ch.Node), "map", next.String())
			}
			return
		}
	}
}

// barrier hands m to every node of nodes until each has installed it (or
// a newer one). It returns false when the driver stops first.
func (d *driver) barrier(m *membership.Map, nodes []membership.Node) bool {
	c := d.c
	state := c.state()
	pending := map[int]membership.Node{}
	for _, n := range nodes {
		if n.ID != c.v().self {
			pending[n.ID] = n
		}
	}
	started := time.Now()
	lastLog := started
	for len(pending) > 0 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		round := make(map[int]membership.Node, len(pending))
		maps.Copy(round, pending)
		for id, n := range round {
			wg.Go(func() {
				ans, err := c.peerFor(n.URL).client.Map(state, time.Now().Add(c.timeout+time.Second))
				if err == nil {
					var st MapState
					if st, err = parseState(ans); err == nil && st.Map.Epoch >= m.Epoch {
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
			c.log.Warn("membership: waiting for nodes to install the cluster map", "epoch", m.Epoch, "nodes", waiting, "for", time.Since(started).Round(time.Second))
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
func (d *driver) handOnce(m *membership.Map, n membership.Node) {
	state := d.c.state()
	for range 3 {
		if _, err := d.c.peerFor(n.URL).client.Map(state, time.Now().Add(d.c.timeout+time.Second)); err == nil {
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
// copied them (its MapState.Moved reaches v's epoch).
func (d *driver) awaitMoved(v *view) bool {
	c := d.c
	pending := map[int]bool{}
	for _, n := range v.Gainers() {
		pending[n] = true
	}
	for len(pending) > 0 {
		for n := range pending {
			if n == v.self {
				if c.moved.Load() >= v.m.Epoch {
					delete(pending, n)
				}
				continue
			}
			ans, err := v.peers[n].client.Map(nil, time.Now().Add(c.timeout+time.Second))
			if err != nil {
				continue
			}
			if st, err := parseState(ans); err == nil && st.Moved >= v.m.Epoch {
				delete(pending, n)
			}
		}
		if len(pending) == 0 {
			break
		}
		var waiting []string
		for n := range pending {
			waiting = append(waiting, v.url(n))
		}
		slices.Sort(waiting)
		d.setStatus("epoch %d (stream): waiting for %s to copy the partitions they gain", v.m.Epoch, strings.Join(waiting, ", "))
		select {
		case <-d.ctx.Done():
			return false
		case <-time.After(barrierRetry):
		}
	}
	return true
}

func stageName(m *membership.Map) string {
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
func (c *Coordinator) agree(v *view, except int) error {
	if v.m.Change != nil {
		return fmt.Errorf("%w: %w: %s", ErrChangeRefused, membership.ErrBusy, v.m)
	}
	for _, id := range v.others() {
		if id == except {
			continue
		}
		ans, err := v.peers[id].client.Map(nil, time.Now().Add(c.timeout+time.Second))
		if err != nil {
			return fmt.Errorf("%w: %s does not answer (every member must, but the one replaced): %w", ErrChangeRefused, v.url(id), err)
		}
		st, err := parseState(ans)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrChangeRefused, v.url(id), err)
		}
		if st.Map.Epoch != v.m.Epoch || st.Map.Change != nil {
			return fmt.Errorf("%w: %s is at %s, this node at %s: try again once they agree", ErrChangeRefused, v.url(id), st.Map, v.m)
		}
	}
	return nil
}

// begin installs m, the first map of a change begun here, which starts
// the driver.
func (c *Coordinator) begin(v *view, m *membership.Map) (*membership.Map, error) {
	ok, err := c.install(m)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: the map changed meanwhile (now %s)", ErrChangeRefused, c.v().m)
	}
	c.log.Info("membership: change begun", "map", m.String(), "was", v.m.Epoch)
	return m, nil
}

// Join begins adding the node at url (http://host:port), which is then
// started with --join naming a member (before or after this call): it
// takes its share of partitions, copied from their replicas, while the
// cluster serves. It returns the change's first map; ChangeStatus tells
// how it goes.
func (c *Coordinator) Join(url string) (*membership.Map, error) {
	v := c.v()
	if err := c.agree(v, -1); err != nil {
		return nil, err
	}
	m, err := v.m.BeginJoin(url, v.self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return c.begin(v, m)
}

// Decommission begins removing the node at url: its partitions are
// copied to the nodes that take them, then it drops out of the map and
// stops.
func (c *Coordinator) Decommission(url string) (*membership.Map, error) {
	v := c.v()
	n, err := c.member(v, url)
	if err != nil {
		return nil, err
	}
	if err := c.agree(v, -1); err != nil {
		return nil, err
	}
	m, err := v.m.BeginDecommission(n.ID, v.self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	return c.begin(v, m)
}

// Replace makes a new, empty machine at newURL take the identity of the
// dead node at oldURL: the map then names newURL for it, and the new
// machine, started with --join, rebuilds the node's data from the other
// replicas before serving reads (rebuild.go). A node that answers is not
// replaced: decommission it instead.
func (c *Coordinator) Replace(oldURL, newURL string) (*membership.Map, error) {
	v := c.v()
	n, err := c.member(v, oldURL)
	if err != nil {
		return nil, err
	}
	if n.ID == v.self {
		return nil, fmt.Errorf("%w: this node is %s and answers: ask another member", ErrChangeRefused, n.URL)
	}
	if _, err := v.peers[n.ID].client.Ping(v.m.Epoch, time.Now().Add(c.timeout)); err == nil {
		return nil, fmt.Errorf("%w: %s answers; only a dead node is replaced (decommission a live one)", ErrChangeRefused, n.URL)
	}
	if err := c.agree(v, n.ID); err != nil {
		return nil, err
	}
	m, err := v.m.Replace(n.ID, newURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	if _, err := c.begin(v, m); err != nil {
		return nil, err
	}
	// No stages: hand the map to the others now (the new machine fetches
	// it when it starts).
	others := slices.DeleteFunc(slices.Clone(m.Nodes), func(x membership.Node) bool { return x.ID == n.ID })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &driver{c: c, ctx: ctx}
	d.barrier(m, others)
	return m, nil
}

func (c *Coordinator) member(v *view, url string) (*membership.Node, error) {
	u, err := membership.NormalizeURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChangeRefused, err)
	}
	n := v.m.ByURL(u)
	if n == nil {
		return nil, fmt.Errorf("%w: %s is not a member", ErrChangeRefused, u)
	}
	return n, nil
}

// ChangeStatus is the cluster map as this node has it, and what the
// change it drives (if any) waits for.
type ChangeStatus struct {
	Map    *membership.Map `json:"map"`
	Self   int             `json:"self"`
	Moved  uint64          `json:"moved"`
	Driver string          `json:"driver,omitempty"` // this node's driver's last status
}

// ChangeStatus returns the map and the driver's status.
func (c *Coordinator) ChangeStatus() ChangeStatus {
	v := c.v()
	c.driver.mu.Lock()
	st := c.driver.status
	c.driver.mu.Unlock()
	return ChangeStatus{Map: v.m, Self: v.self, Moved: c.moved.Load(), Driver: st}
}

// leave runs once when the map no longer has this node.
func (c *Coordinator) leave() {
	c.leftOnce.Do(func() {
		c.log.Warn("membership: this node is no longer in the cluster map (decommissioned); stopping")
		go c.onLeft() // not on the installing goroutine: stopping waits for it
	})
}
