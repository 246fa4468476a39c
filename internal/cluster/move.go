package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/partition"
)

// mover does what a new cluster map asks of this node's data
// (membership.Stage):
//
//   - in a change's stream stage, it copies every partition this node
//     gains from every replica of the partition's old set, by anti-entropy
//     exchanges restricted to those partitions and pulling only; then it
//     reports the stage's epoch as moved (MapState.Moved), which the
//     change's driver waits for. Every replica of the old set, because a
//     write acknowledged before the change may be on ack of them only.
//     A restart in this stage copies again: an exchange moves only what
//     differs.
//   - once a change is over, it deletes the partitions this node no
//     longer holds. A marker in the store makes a restart finish it.
//
// A newer map cancels the running job and starts the next one.
type mover struct {
	c      *Coordinator
	mu     sync.Mutex
	cancel context.CancelFunc // the running job's; nil when none
	closed bool
	done   sync.WaitGroup
	last   *view // the last view updated to
}

func newMover(c *Coordinator) *mover { return &mover{c: c} }

// moveRetry is the wait before copying from a replica again after a
// failed exchange.
const moveRetry = 2 * time.Second

// update starts what v asks.
func (mv *mover) update(v *view) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.closed {
		return
	}
	prev := mv.last
	mv.last = v
	var job func(context.Context)
	switch {
	case v.m.Change != nil && v.m.Change.Stage == membership.Stream:
		job = func(ctx context.Context) { mv.copyGained(ctx, v) }
	case v.m.Change == nil && prev != nil && prev.Moving:
		// A change just ended (install marked the cleanup pending).
		job = func(ctx context.Context) { mv.cleanup(ctx, v) }
	case v.m.Change == nil && prev == nil:
		if pending, err := mv.c.local.Store.CleanupPending(); err != nil || !pending {
			return
		}
		job = func(ctx context.Context) { mv.cleanup(ctx, v) } // a restart's
	default:
		return
	}
	if mv.cancel != nil {
		mv.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	mv.cancel = cancel
	mv.done.Add(1)
	go func() {
		defer mv.done.Done()
		job(ctx)
	}()
}

func (mv *mover) close() {
	mv.mu.Lock()
	mv.closed = true
	if mv.cancel != nil {
		mv.cancel()
	}
	mv.mu.Unlock()
	mv.done.Wait()
}

// copyGained copies the partitions this node gains in v's change from
// each of their old replicas, until every copy succeeded or ctx ends.
func (mv *mover) copyGained(ctx context.Context, v *view) {
	c := mv.c
	from := v.Gains(v.self)
	if len(from) == 0 {
		c.moved.Store(v.m.Epoch)
		return
	}
	gained := map[partition.ID]bool{} // each has several sources
	for _, ps := range from {
		for _, p := range ps {
			gained[p] = true
		}
	}
	parts := len(gained)
	start := time.Now()
	var total ExchangeStats
	c.log.Info("membership: copying the partitions this node gains", "epoch", v.m.Epoch, "partitions", parts, "sources", len(from))
	for len(from) > 0 {
		for r, ps := range from {
			st, err := c.ae.exchange(ctx, v, r, ps, true)
			total.Pulled += st.Pulled
			total.RecordBytes += st.RecordBytes
			total.SummaryBytes += st.SummaryBytes
			c.m.moveRecords.Add(float64(st.Pulled))
			c.m.moveBytes.Add(float64(st.RecordBytes + st.SummaryBytes))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				c.log.Warn("membership: copy from a replica failed; trying again", "peer", v.url(r), "err", err)
				continue
			}
			delete(from, r)
		}
		if len(from) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(moveRetry):
		}
	}
	c.moved.Store(v.m.Epoch)
	c.log.Info("membership: partitions copied", "epoch", v.m.Epoch, "records", total.Pulled,
		"record_bytes", total.RecordBytes, "summary_bytes", total.SummaryBytes, "took", time.Since(start).Round(time.Millisecond))
}

// cleanup deletes every partition this node does not hold in v, then
// clears the store's pending-cleanup marker.
func (mv *mover) cleanup(ctx context.Context, v *view) {
	c := mv.c
	var buf [maxReplicas]int
	removed, parts := 0, 0
	for p := range partition.Count {
		if ctx.Err() != nil {
			return
		}
		part := partition.ID(p)
		if slices.Contains(v.OldReplicas(part, buf[:0]), v.self) {
			continue
		}
		n, err := c.local.DropPartition(part)
		if err != nil {
			c.log.Error("membership: drop a partition no longer held; dropped at the next start", "partition", p, "err", err)
			return
		}
		removed += n
		if n > 0 {
			parts++
		}
	}
	if err := c.local.Store.SetCleanupPending(false); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error("clear the pending cleanup", "err", err)
	}
	c.m.moveDropped.Add(float64(removed))
	c.log.Info("membership: dropped the partitions no longer held", "epoch", v.m.Epoch, "partitions", parts, "records", removed)
}
