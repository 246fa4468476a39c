package cluster

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/dhtkv/dhtkv/internal/scan"
)

// ScanLocal returns this node's own records with start <= key < end (end
// nil: to the last key), tombstones included, from a snapshot of its
// store; ErrLocalRebuilding while its replica rebuilds. The caller must
// close the iterator.
func (c *Coordinator) ScanLocal(start, end []byte) (scan.Iterator, error) {
	if c.d.Rebuilding() {
		// Incomplete: answered, its records would read as the range's
		// whole (a point read of the local replica is refused alike).
		return nil, ErrLocalRebuilding
	}
	it, err := c.local.NewIter(start, end)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	return it, nil
}

// Scan opens a cluster-wide range scan: every node's records with
// start <= key < end, merged so that each key appears once with its newest
// version (tombstones included; the caller decides what to show). start
// and end may be the handler's buffers: they are copied. Cancelling ctx
// aborts every node's stream at any point; the caller must close the
// iterator.
//
// Every node is asked, since a range holds keys of every replica set. A
// node whose stream does not open within the replica timeout has not
// answered; the scan proceeds only if every key still has ack answering
// replicas among its from (see checkQuorum), else it fails with
// ErrNotEnoughReplicas naming the nodes that failed.
func (c *Coordinator) Scan(ctx context.Context, start, end []byte, ack, from int) (scan.Iterator, error) {
	start = bytes.Clone(start)
	if end != nil {
		end = bytes.Clone(end)
	}
	v := c.d.Views()
	if v.Self < 0 {
		return nil, ErrNotAMember
	}
	nodes := v.Map.Nodes
	srcs := make([]scan.Iterator, len(nodes))
	errs := make([]error, len(nodes))
	self := -1
	var wg sync.WaitGroup
	for i, n := range nodes {
		if n.ID == v.Self {
			self = i
			continue
		}
		wg.Go(func() {
			it, err := c.d.Streams.Open(ctx, n.URL, v.Epoch(), start, end)
			if err == nil {
				srcs[i] = it
			}
			errs[i] = err
		})
	}
	// The local stream is read from the store directly, no HTTP; a
	// rebuilding replica's is incomplete and does not count (ScanLocal).
	srcs[self], errs[self] = c.ScanLocal(start, end)
	wg.Wait()

	var open []scan.Iterator
	var failed []string
	for i, it := range srcs {
		if errs[i] != nil {
			failed = append(failed, errs[i].Error())
			continue
		}
		open = append(open, it)
	}
	// A key's replicas in the set read are at most that set's factor (a
	// replicas change makes the sets' factors differ): from is cut to it,
	// as for a Get (placement.Sets.ReadReplicas).
	if err := checkQuorum(len(failed), ack, min(from, v.ReadFactor())); err != nil {
		for _, it := range open {
			it.Close()
		}
		c.log.Info("cluster scan refused", "failed", strings.Join(failed, "; "), "ack", ack, "from", from)
		return nil, fmt.Errorf("%w: %d of %d nodes did not open their stream (%s)",
			err, len(failed), len(nodes), strings.Join(failed, "; "))
	}
	if len(failed) > 0 {
		c.log.Debug("cluster scan without some nodes", "failed", strings.Join(failed, "; "))
	}
	if len(open) == 1 {
		return open[0], nil
	}
	return scan.NewMerge(open), nil
}

// checkQuorum decides whether a scan without `failed` nodes is complete for
// every key. A key lives on its first `from` nodes by placement, and
// rendezvous hashing gives some key every possible set of from nodes; so
// every key keeps at least ack answering replicas exactly when no more than
// from-ack nodes failed. The rule is exact over the key space and
// conservative for one range (whose keys may all avoid the failed nodes),
// which is the price of deciding before the first byte is sent.
func checkQuorum(failed, ack, from int) error {
	if failed > from-ack {
		return fmt.Errorf("cluster scan with ack=%d from=%d tolerates %d failed nodes: %w",
			ack, from, from-ack, ErrNotEnoughReplicas)
	}
	return nil
}
