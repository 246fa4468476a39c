package view

import (
	"time"

	"github.com/dhtkv/dhtkv/internal/record"
)

// Call is one replica call made without waiting for it (Starter.Go): a
// Get, or an Apply when Env is set. The caller fills the request fields
// and Done; the peer fills the outcome and then sends the call on Done,
// once, after which the call is the caller's again. It is net/rpc's
// Client.Go shape: a coordinator calling several replicas waits on one
// channel for all of them, with no goroutine per call.
type Call struct {
	// The request.
	Key      []byte
	Env      []byte // the encoded record of an Apply; nil: a Get
	Epoch    uint64
	Deadline time.Time
	// Tag is the caller's, untouched by the peer (which replica this is).
	Tag int
	// Background marks a read made for background work (anti-entropy
	// pulling records it found differing): a peer that can (rpc.Peer)
	// sends it apart from the requests' reads and asks the other node
	// not to keep the record in its read cache.
	Background bool
	// Done receives the call when it ends. It must have room for it: the
	// peer's sender must never block on a caller.
	Done chan<- *Call

	// The outcome: Get's (Rec, Found) or Apply's (Newer), and Err, and
	// when the call ended (its latency is to be measured to then, not to
	// when its caller got round to receiving it).
	Rec   record.Record
	Found bool
	Newer uint64
	Err   error
	Ended time.Time
}

// Starter is a Peer that can start a call without waiting for it. A Peer
// that is not one is called with Get or Apply on a goroutine of the
// caller's (Go).
type Starter interface {
	// Go starts c and returns at once; c is sent on c.Done when it ends
	// (by its deadline, as every call).
	Go(c *Call)
}

// Go starts c on p: by p's own Go if it is a Starter, else with Get or
// Apply on a new goroutine.
func Go(p Peer, c *Call) {
	if s, ok := p.(Starter); ok {
		s.Go(c)
		return
	}
	go func() {
		if c.Env != nil {
			c.Newer, c.Err = p.Apply(c.Key, c.Env, c.Epoch, c.Deadline)
		} else {
			c.Rec, c.Found, c.Err = p.Get(c.Key, c.Epoch, c.Deadline)
		}
		c.Ended = time.Now()
		c.Done <- c
	}()
}
