// Package hlc implements the hybrid logical clock that versions dhtkv's
// writes.
//
// A version is a uint64 laid out as
//
//	bits 63..20  wall-clock milliseconds since the Unix epoch (44 bits: until year 2527)
//	bits 19..8   logical counter (12 bits: 4096 writes per millisecond per node)
//	bits  7..0   node id (0..255)
//
// Versions are strictly increasing on one node even when the wall clock
// stalls or steps back (the logical counter, then the millisecond, advance),
// unique across nodes (the node id is the tie-break), and monotonic with
// causality: a node that observes a version from another node (Observe) never
// issues a smaller one afterwards. Two writes in the same millisecond from
// different coordinators are therefore still ordered, deterministically, by
// the node id. Comparing versions is plain integer comparison.
package hlc

import (
	"fmt"
	"sync"
	"time"
)

const (
	nodeBits    = 8
	logicalBits = 12
	// MaxNodeID is the largest node id a version can carry.
	MaxNodeID  = 1<<nodeBits - 1
	logicalMax = 1<<logicalBits - 1
)

// Clock issues versions. The zero value is not usable; call New.
type Clock struct {
	node uint64
	now  func() time.Time

	mu   sync.Mutex
	last uint64 // last issued or observed version, node bits cleared
}

// New returns a clock for node id (0..MaxNodeID). now may be nil for the
// wall clock; tests pass a fake.
func New(node int, now func() time.Time) (*Clock, error) {
	if node < 0 || node > MaxNodeID {
		return nil, fmt.Errorf("hlc: node id %d out of range 0..%d", node, MaxNodeID)
	}
	if now == nil {
		now = time.Now
	}
	return &Clock{node: uint64(node), now: now}, nil
}

// Next returns a version greater than every version this clock has issued or
// observed.
func (c *Clock) Next() uint64 {
	wall := uint64(c.now().UnixMilli()) << (logicalBits + nodeBits)
	c.mu.Lock()
	v := c.last + 1<<nodeBits // same millisecond: next logical tick
	if wall > v {
		v = wall
	}
	// Overflowing the logical counter carries into the millisecond field,
	// which makes this clock run slightly ahead of the wall clock: allowed
	// by the HLC, and it keeps versions strictly increasing.
	c.last = v
	c.mu.Unlock()
	return v | c.node
}

// Observe advances the clock past a version seen from another node, so that
// writes this node coordinates later are ordered after it.
func (c *Clock) Observe(v uint64) {
	v &^= MaxNodeID
	c.mu.Lock()
	if v > c.last {
		c.last = v
	}
	c.mu.Unlock()
}

// Parts splits a version into its fields, for logs and tests.
func Parts(v uint64) (ms int64, logical int, node int) {
	return int64(v >> (logicalBits + nodeBits)), int(v>>nodeBits) & logicalMax, int(v & MaxNodeID)
}
