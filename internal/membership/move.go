package membership

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/view"
)

// Exchanger copies the records of parts that peer holds and this node
// lacks, routed by v: an anti-entropy exchange pulling only
// (antientropy.Service.Exchange).
type Exchanger interface {
	Exchange(ctx context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error)
}

// mover does what a new cluster map asks of this node's data
// (clustermap.Stage):
//
//   - in a change's stream stage, it copies every partition this node
//     gains from every replica of the partition's old set, by anti-entropy
//     exchanges restricted to those partitions and pulling only; then it
//     reports the stage's epoch as moved (State.Moved), which the
//     change's driver waits for. Every replica of the old set, because a
//     write acknowledged before the change may be on ack of them only.
//     A restart in this stage copies again: an exchange moves only what
//     differs.
//   - once a change is over, it deletes the partitions this node no
//     longer holds. A marker in the store makes a restart finish it.
//
// A newer map cancels the running job and starts the next one.
type mover struct {
	s      *Service
	mu     sync.Mutex
	cancel context.CancelFunc // the running job's; nil when none
	closed bool
	done   sync.WaitGroup
	last   *view.View // the last view updated to
}

// moveRetry is the wait before copying from a replica again after a
// failed exchange.
const moveRetry = 2 * time.Second

// update starts what v asks.
func (mv *mover) update(v *view.View) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.closed {
		return
	}
	prev := mv.last
	mv.last = v
	var job func(context.Context)
	switch {
	case v.Map.Change != nil && v.Map.Change.Stage == clustermap.Stream:
		job = func(ctx context.Context) { mv.copyGained(ctx, v) }
	case v.Map.Change == nil && prev != nil && prev.Moving:
		// A change just ended (install marked the cleanup pending).
		job = func(ctx context.Context) { mv.cleanup(ctx, v) }
	case v.Map.Change == nil && prev == nil:
		if pending, err := mv.s.local.Store.CleanupPending(); err != nil || !pending {
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
func (mv *mover) copyGained(ctx context.Context, v *view.View) {
	s := mv.s
	from := v.Gains(v.Self)
	if len(from) == 0 {
		s.moved.Store(v.Map.Epoch)
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
	var total antientropy.ExchangeStats
	s.log.Info("membership: copying the partitions this node gains", "epoch", v.Map.Epoch, "partitions", parts, "sources", len(from))
	for len(from) > 0 {
		for r, ps := range from {
			st, err := s.o.Exchange.Exchange(ctx, v, r, ps, true)
			total.Pulled += st.Pulled
			total.RecordBytes += st.RecordBytes
			total.SummaryBytes += st.SummaryBytes
			s.m.moveRecords.Add(float64(st.Pulled))
			s.m.moveBytes.Add(float64(st.RecordBytes + st.SummaryBytes))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("membership: copy from a replica failed; trying again", "peer", v.URL(r), "err", err)
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
	s.moved.Store(v.Map.Epoch)
	s.log.Info("membership: partitions copied", "epoch", v.Map.Epoch, "records", total.Pulled,
		"record_bytes", total.RecordBytes, "summary_bytes", total.SummaryBytes, "took", time.Since(start).Round(time.Millisecond))
}

// cleanup deletes every partition this node does not hold in v, then
// clears the store's pending-cleanup marker.
func (mv *mover) cleanup(ctx context.Context, v *view.View) {
	s := mv.s
	removed, parts := 0, 0
	for p := range partition.Count {
		if ctx.Err() != nil {
			return
		}
		part := partition.ID(p)
		if v.Holds(part, v.Self) {
			continue
		}
		n, err := s.local.DropPartition(part)
		if err != nil {
			s.log.Error("membership: drop a partition no longer held; dropped at the next start", "partition", p, "err", err)
			return
		}
		removed += n
		if n > 0 {
			parts++
		}
	}
	if err := s.local.Store.SetCleanupPending(false); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("clear the pending cleanup", "err", err)
	}
	s.m.moveDropped.Add(float64(removed))
	s.log.Info("membership: dropped the partitions no longer held", "epoch", v.Map.Epoch, "partitions", parts, "records", removed)
}
