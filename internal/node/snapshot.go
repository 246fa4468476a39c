package node

import (
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/admin"
)

// checkpoints guards the store's checkpoints (the admin listener's POST
// /snapshot): the store must not close under a running one, which cannot
// be interrupted. Once closed, it refuses new checkpoints (ErrStopping),
// and close itself returns when the running one has ended.
type checkpoints struct {
	cp      admin.Checkpointer
	mu      sync.Mutex
	closed  bool
	running sync.WaitGroup
}

// newCheckpoints returns the guard of s's checkpoints, or nil if s cannot
// checkpoint. The store implements admin.Checkpointer with Pebble's
// DB.Checkpoint (markedCheckpoints); a store
// without the method leaves /snapshot answering 501.
func newCheckpoints(s any) *checkpoints {
	cp, ok := s.(admin.Checkpointer)
	if !ok {
		return nil
	}
	return &checkpoints{cp: cp}
}

// Checkpoint implements admin.Checkpointer.
func (c *checkpoints) Checkpoint(dir string) (time.Time, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return time.Time{}, ErrStopping
	}
	c.running.Add(1)
	c.mu.Unlock()
	defer c.running.Done()
	return c.cp.Checkpoint(dir)
}

// close refuses new checkpoints and waits for the running one.
func (c *checkpoints) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.running.Wait()
}

// checkpointer is what the admin listener's /snapshot checkpoints with.
func (n *Node) checkpointer() admin.Checkpointer {
	if n.checkpoints == nil {
		return nil // not a typed nil: the handler answers 501
	}
	return n.checkpoints
}

// markedCheckpoints checkpoints the node's store, marked with the time up
// to which its replica holds every write the cluster acknowledged
// (completeAsOf), which a node started on a copy of it weighs against
// the garbage collection's grace (checkRestoredSnapshot).
type markedCheckpoints struct{ n *Node }

func (m markedCheckpoints) Checkpoint(dir string) (time.Time, error) {
	complete := m.n.completeAsOf()
	if complete.IsZero() {
		m.n.log.Warn("snapshot taken before this node completed an anti-entropy exchange with every peer since its start (or while it rebuilds): a node started on it refuses to without --restore-old-snapshot, as it may lack deletes the others have since collected",
			"dir", dir)
	}
	return complete, m.n.store.Checkpoint(dir, complete, shortestGrace(m.n.cfg.gcGrace(), m.n.probe.PeerStates()))
}

// completeAsOf is the time up to which this node's replica holds every
// write the cluster acknowledged, deletes included: the earliest start of
// the last complete anti-entropy exchanges with its peers (each left it
// holding everything the peer held when it started; a write acknowledged
// without this node was on one of them), now for a node without peers,
// and zero (unknown) when an exchange with one has not completed under
// the current cluster map (one under another compared other replica
// sets, and one during a change only some partitions), while a change is
// under way, or while the node rebuilds or is unconfirmed.
func (n *Node) completeAsOf() time.Time {
	if n.rebuild.Rebuilding() || n.rebuild.Unconfirmed() {
		return time.Time{}
	}
	v := n.members.View()
	if v.Moving {
		return time.Time{}
	}
	synced := n.ae.SyncedSince()
	complete := time.Now()
	for _, i := range v.Others() {
		at := synced[i].At
		if at.IsZero() || at.Before(v.Since) {
			return time.Time{}
		}
		if at.Before(complete) {
			complete = at
		}
	}
	return complete
}
