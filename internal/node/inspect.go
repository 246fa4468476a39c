package node

import (
	"time"

	"github.com/dhtkv/dhtkv/internal/store"
)

// Store is the node's store, open from New until Shutdown or Close. Tests
// read it to show what this node's replica holds (records, tombstones,
// hints) without asking the node; a write through it would bypass the
// clock, the read cache and the version filter, so tests only read.
func (n *Node) Store() *store.Store { return n.store }

// CompleteAsOf is the time up to which the node's replica holds every
// write the cluster acknowledged, as a snapshot taken now would record it
// (zero: not known).
func (n *Node) CompleteAsOf() time.Time { return n.completeAsOf() }
