package node

import (
	"sync"

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
// DB.Checkpoint (func (s *Store) Checkpoint(dir string) error); a store
// without the method leaves /snapshot answering 501.
func newCheckpoints(s any) *checkpoints {
	cp, ok := s.(admin.Checkpointer)
	if !ok {
		return nil
	}
	return &checkpoints{cp: cp}
}

// Checkpoint implements admin.Checkpointer.
func (c *checkpoints) Checkpoint(dir string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrStopping
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
