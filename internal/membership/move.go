package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/view"
)

// Exchanger compares partitions with a replica of their old set and pulls
// the records that differ: an anti-entropy exchange pulling only
// (antientropy.Service.Exchange).
type Exchanger interface {
	Exchange(ctx context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error)
}

// Copier copies every record of some partitions from another node in one
// stream, routed by the map of epoch (partcopy.Copier.Copy).
type Copier interface {
	Copy(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error)
}

// mover does what a new cluster map asks of this node's data
// (clustermap.Stage):
//
//   - in a change's stream stage, it copies every partition this node
//     gains from every replica of the partition's old set (every live
//     one, when the change removes a dead node: liveGains), then reports
//     the stage's epoch as moved (State.Moved), reported to the map's log
//     (Log.Copied), which advances the stage once every gainer did. Every
//     replica of the old set, because a write acknowledged before the
//     change may be on ack of them only. Each
//     partition is streamed whole from one of them (planCopy: spread
//     evenly over them, and streamed from all at once), then compared with
//     each of the others by an anti-entropy exchange that pulls only what
//     differs: a few records, those the first source missed. A restart in
//     this stage copies again.
//   - once a change is over, and when the node starts with no change under
//     way, it deletes the partitions this node does not hold: those it
//     gave away, and any record left outside its partitions (by an
//     earlier release's rebuild, which copied every peer's whole store).
//     A marker in the store makes a restart finish a change's. The
//     deletes are paced by pace (Options.DropRate), shared by every drop
//     of the service's life: a join gives away a quarter of each old
//     replica's records, and deleted in a burst they took the node's
//     cores and disk from requests for more than a second.
//
// A newer map cancels the running job; the next one starts once the
// cancelled one has returned, so that a drop of a partition by an older
// map never runs beside a copy into it.
type mover struct {
	s      *Service
	mu     sync.Mutex
	cancel context.CancelFunc // the running job's; nil when none
	prev   chan struct{}      // closed when the last job started has returned
	closed bool
	done   sync.WaitGroup
	last   *view.View    // the last view updated to
	pace   *rate.Limiter // the drops' records a second; burst store.DropChunk
}

// moveRetry is the wait before copying from a replica again after a
// failed copy or exchange.
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
	case v.Map.Change != nil && v.Map.Change.Stage == clustermap.Stream && prev != nil &&
		prev.Map.SamePlacement(v.Map) && mv.s.moved.Load() >= prev.Map.Epoch:
		// A replace during the stream stage: the partitions this node
		// gains are the same, and it copied them from every replica of
		// their old set already.
		mv.s.setMoved(v.Map.Epoch)
		return
	case v.Map.Change != nil && v.Map.Change.Stage == clustermap.Stream:
		job = func(ctx context.Context) { mv.copyGained(ctx, v) }
	case v.Map.Change != nil && prev != nil && !prev.Moving:
		// A change begins: a cleanup still dropping what the last one
		// took away stops, as it may drop a partition this one gives
		// back, with the writes of its write-both stage. Its marker
		// stays; it runs again when this change ends, by the map then.
		if mv.cancel != nil {
			mv.cancel()
			mv.cancel = nil
		}
		return
	case v.Map.Change == nil && prev != nil && prev.Moving:
		// A change just ended (install marked the cleanup pending).
		job = func(ctx context.Context) { mv.cleanup(ctx, v) }
	case v.Map.Change == nil && prev == nil:
		// A start: drop what a cleanup left, and any record outside
		// this node's partitions.
		job = func(ctx context.Context) { mv.cleanup(ctx, v) }
	default:
		return
	}
	if mv.cancel != nil {
		mv.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	mv.cancel = cancel
	before, done := mv.prev, make(chan struct{})
	mv.prev = done
	mv.done.Add(1)
	go func() {
		defer mv.done.Done()
		defer close(done)
		if before != nil {
			<-before
		}
		if ctx.Err() == nil {
			job(ctx)
		}
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

// planCopy chooses, for the partitions a node gains (from: by old replica,
// the partitions to copy from it), the source each partition is streamed
// from whole (bulk) and the replicas each is compared with afterwards
// (rest). The partitions are spread evenly over their old replicas: each,
// in ascending order, goes to the one of its replicas with the fewest so
// far (the lowest id of equals). copyGained streams from every source at
// once, so the copy goes at the sum of the senders' paces (each sender's
// --move-rate under its own background pace), up to the gaining node's
// own, and no one old replica sends it all. Each source walks its whole
// store to pick out its partitions (about a microsecond or two a key), a
// small price next to the records it sends, which are the copy's cost at
// both ends.
func planCopy(from map[int][]partition.ID) (bulk map[int]*partition.Set, rest map[int][]partition.ID) {
	bulk, rest = map[int]*partition.Set{}, map[int][]partition.ID{}
	holders := map[partition.ID][]int{}
	for r, ps := range from {
		for _, p := range ps {
			holders[p] = append(holders[p], r)
		}
	}
	load := map[int]int{}
	for _, p := range slices.Sorted(maps.Keys(holders)) {
		rs := holders[p]
		slices.Sort(rs)
		best := rs[0]
		for _, r := range rs[1:] {
			if load[r] < load[best] {
				best = r
			}
		}
		load[best]++
		if bulk[best] == nil {
			bulk[best] = &partition.Set{}
		}
		bulk[best].Add(p)
		for _, r := range rs {
			if r != best {
				rest[r] = append(rest[r], p)
			}
		}
	}
	return bulk, rest
}

// dropLeftovers drops, before the copy, what this node holds of the
// partitions it gains from before the change began here (the time its
// install of the change's first map recorded, store.Store.ChangeBegan):
// records left from an earlier time it held one, whose drop the change
// cut short (cleanup stops at a newer map). A leftover whose delete the
// replicas collected while the partition was away would otherwise outlive
// the delete: the copy brings nothing to beat it, and once the change
// ends the partition is this node's again, so no cleanup drops it. What
// arrived since stays: the writes of the change's write-both stage,
// which an old replica may not have yet when the copy reads it, and the
// copy itself, which the map's log may already count should this run
// again after a restart (the log then moves on once the other gainers
// are done, and a copy dropped and begun again would stop unfinished).
// The gained partitions are not read here until the copy is done
// (read-old). A partition one of whose old replicas the map counts dead
// keeps what it holds: a write acknowledged at ack=1 may be on that one
// and here only. With no time recorded (a node that joined with the
// change has nothing from before) nothing is dropped. It reports false
// once ctx ended.
func (mv *mover) dropLeftovers(ctx context.Context, v *view.View) bool {
	s := mv.s
	began, err := s.local.Store.ChangeBegan()
	if err != nil {
		s.log.Error("membership: read when the change began here; copying over what this node holds of the partitions it gains", "err", err)
		return ctx.Err() == nil
	}
	if began == 0 {
		return true
	}
	if now := uint64(time.Now().UnixMilli()); now < began {
		// Arrivals since are stamped before the moment too: the drop
		// would take this change's writes and copy for leftovers.
		s.log.Warn("membership: this node's clock is behind the moment the change began here (stepped back?); keeping what it holds of the partitions it gains",
			"behind", time.Duration(began-now)*time.Millisecond)
		return true
	}
	gained, deadSource := map[partition.ID]bool{}, map[partition.ID]bool{}
	for r, ps := range v.Gains(v.Self) {
		for _, p := range ps {
			gained[p] = true
			deadSource[p] = deadSource[p] || v.Dead(r)
		}
	}
	held, err := s.local.Store.Held(func(p partition.ID) bool { return gained[p] && !deadSource[p] })
	if err != nil {
		s.log.Error("membership: find what this node holds of the partitions it gains; copying over it", "err", err)
		return ctx.Err() == nil
	}
	removed := 0
	for _, part := range held {
		// Unpaced: the copy waits for it, and it drops no more than a
		// drop cut short left.
		n, err := s.local.DropHeld(ctx, part, nil, began)
		removed += n
		s.m.moveDropped.Add(float64(n))
		if ctx.Err() != nil {
			return false
		}
		if err != nil {
			s.log.Error("membership: drop what this node held of a partition it gains; copying over it", "partition", part, "err", err)
		}
	}
	if removed > 0 {
		s.log.Info("membership: dropped what this node held of the partitions it gains from before the change, before copying them", "epoch", v.Map.Epoch,
			"partitions", len(held), "records", removed)
	}
	return true
}

// copyGained copies the partitions this node gains in v's change from
// each of their old replicas (see mover), until every copy succeeded or
// ctx ends.
//
// A stream succeeded only if it stored or kept out as older every record
// it brought: a record refused because its version is too far ahead of
// this node's clock (the clock is behind) is not here, and with one
// replica no comparison follows to find it, so the old replica would
// drop the only copy of an acknowledged write at the change's end. The
// stream is tried again until this clock is right; the change waits in
// its stream stage meanwhile, as for a node that is down
// (TestMembershipFaultClockBehindCopyWaits).
func (mv *mover) copyGained(ctx context.Context, v *view.View) {
	s := mv.s
	from, unsourced := liveGains(v)
	if len(unsourced) > 0 {
		// Every replica of their old set is counted dead (two dead
		// members removed together, each holding the partition): what
		// only they held is lost, and nobody is left to copy from.
		s.log.Warn("membership: partitions this node gains have no live replica in the old set to copy from: only what this node holds of them is left",
			"epoch", v.Map.Epoch, "partitions", len(unsourced), "first", unsourced[0])
	}
	kept := keptFromLeavers(v)
	if len(from) == 0 && len(kept) == 0 {
		s.setMoved(v.Map.Epoch)
		return
	}
	if !mv.dropLeftovers(ctx, v) {
		return
	}
	bulk, rest := planCopy(from)
	for r, ps := range kept {
		rest[r] = append(rest[r], ps...)
	}
	parts := 0
	for _, set := range bulk {
		parts += set.Len()
	}
	start := time.Now()
	var copied partcopy.Stats
	var total antientropy.ExchangeStats
	s.log.Info("membership: copying the partitions this node gains", "epoch", v.Map.Epoch, "partitions", parts,
		"streamed_from", len(bulk), "compared_with", len(rest))
	// 1. Each partition streamed whole from one replica, every source at
	// once.
	var mu sync.Mutex // guards copied and total
	stale := streamAll(ctx, slices.Sorted(maps.Keys(bulk)), moveRetry, func(ctx context.Context, r int) error {
		st, err := s.o.Copy.Copy(ctx, v.URL(r), v.Epoch(), bulk[r])
		mu.Lock()
		copied.Add(st)
		mu.Unlock()
		s.m.moveRecords.Add(float64(st.Records))
		s.m.moveBytes.Add(float64(st.Bytes))
		if err == nil && st.Refused > 0 {
			err = fmt.Errorf("%d records left out, too far ahead of this node's clock (is it behind?)", st.Refused)
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, partcopy.ErrStale) {
			s.log.Warn("membership: streaming partitions from a replica failed; trying again", "peer", v.URL(r), "err", err)
		}
		return err
	})
	if stale {
		// A newer map is installed: what it asks replaces this.
		s.log.Warn("membership: a newer cluster map stopped the copy of gained partitions", "epoch", v.Map.Epoch)
		return
	}
	if ctx.Err() != nil {
		return
	}
	streamed := time.Since(start)
	// 2. Compared with every other replica of their old set, up to
	// compareAtOnce of them at once (each exchange paces its own walks:
	// antientropy.Service.Exchange), each tried again until it succeeds.
	var wg sync.WaitGroup
	slots := make(chan struct{}, compareAtOnce)
	for r, parts := range rest {
		wg.Go(func() {
			for {
				// A slot for each attempt: a peer that fails does not
				// hold one while it waits to try again.
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
				st, err := s.o.Exchange.Exchange(ctx, v, r, parts, true)
				<-slots
				mu.Lock()
				total.Pulled += st.Pulled
				total.RecordBytes += st.RecordBytes
				total.SummaryBytes += st.SummaryBytes
				mu.Unlock()
				s.m.moveRecords.Add(float64(st.Pulled))
				s.m.moveBytes.Add(float64(st.RecordBytes + st.SummaryBytes))
				if err == nil || ctx.Err() != nil {
					return
				}
				s.log.Warn("membership: comparing partitions with a replica failed; trying again", "peer", v.URL(r), "err", err)
				if !sleepCtx(ctx, moveRetry) {
					return
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	s.setMoved(v.Map.Epoch)
	s.log.Info("membership: partitions copied", "epoch", v.Map.Epoch,
		"streamed_records", copied.Records, "streamed_bytes", copied.Bytes, "stored", copied.Applied, "streamed_in", streamed.Round(time.Millisecond),
		"pulled_records", total.Pulled, "pulled_bytes", total.RecordBytes, "summary_bytes", total.SummaryBytes,
		"took", time.Since(start).Round(time.Millisecond))
}

// compareAtOnce is how many old replicas a gaining node compares its
// copies with at once. Each comparison paces its own index walks at the
// summaries' rate (--ae-summary-rate, antientropy.Service.Exchange), and
// the peer's walks follow it, so each peer is walked no faster than by
// one exchange of this node's, and this node, which serves no reads of
// the partitions it gains yet, at up to three times the rate. Three
// because a join of a fourth node to three at three replicas compares
// each partition with the two other replicas of its old set, spread over
// the three old nodes: one pass rather than three. (Several nodes gaining
// at once, in a leave or a change of the replication factor, may each
// compare with the same peer, as before.)
const compareAtOnce = 3

// liveGains returns, by old replica, the partitions this node gains in
// v's change, from every replica of the old set but those the map counts
// dead (view.View.Dead): a copy is complete once it read every live one.
// A write acknowledged by ack >= 2 replicas of the old set reached a live
// one while at most one of them is dead; one acknowledged by dead nodes
// alone is lost (docs/membership.md, "Removing a dead member"). unsourced
// are the gained partitions whose every old replica is dead.
func liveGains(v *view.View) (from map[int][]partition.ID, unsourced []partition.ID) {
	from = v.Gains(v.Self)
	sourced := map[partition.ID]bool{}
	for r, ps := range from {
		if !v.Dead(r) {
			for _, p := range ps {
				sourced[p] = true
			}
		}
	}
	for r, ps := range from {
		if !v.Dead(r) {
			continue
		}
		delete(from, r)
		for _, p := range ps {
			if !sourced[p] {
				sourced[p] = true // counted once
				unsourced = append(unsourced, p)
			}
		}
	}
	slices.Sort(unsourced)
	return from, unsourced
}

// keptFromLeavers returns, by live old replica leaving them, the
// partitions this node keeps (in both sets) whose new set gains no node:
// a replicas change lowering the factor, where nothing is copied, and
// the old replicas that lose a rank drop the partition at the end. A
// write acknowledged before the change may be on those alone (at factor
// 3, ack=2 on the second and third ranked while the first was down and
// its hint expired; lowered to 1, the first holds the partition alone),
// so this node compares the partition with each of them, pulling only,
// before the change may end.
func keptFromLeavers(v *view.View) map[int][]partition.ID {
	out := map[int][]partition.ID{}
	var oldBuf, newBuf [8]int
	for p := range partition.Count {
		part := partition.ID(p)
		old := v.Old.PartitionReplicas(part, v.OldFactor, oldBuf[:0])
		nw := v.New.PartitionReplicas(part, v.NewFactor, newBuf[:0])
		if !slices.Contains(old, v.Self) || !slices.Contains(nw, v.Self) {
			continue
		}
		if slices.ContainsFunc(nw, func(n int) bool { return !slices.Contains(old, n) }) {
			continue // a gainer copies from every old replica
		}
		for _, r := range old {
			if !slices.Contains(nw, r) && !v.Dead(r) {
				out[r] = append(out[r], part)
			}
		}
	}
	return out
}

// keptForDead reports whether partition p, not held by this node in v
// (a map without a change), has a replica that v's map counts dead: one a
// remove counted dead during the change that just ended
// (clustermap.Map.Removing), which gained p in it and never copied it. The
// old replicas keep their copies until the dead node is removed, when p
// moves again: its gainers then copy it from the live replicas (this node
// among them if it gains p back, as it does when it held p before the
// change), and the cleanup after that removal drops what is still not
// held. Dropped now, p would be on one live replica fewer until then, and
// with one replica (--replicas 1) on none.
// notHeld reports, for v, the partitions this node drops: those it does
// not hold, but those kept for a dead replica.
func notHeld(v *view.View) func(partition.ID) bool {
	return func(p partition.ID) bool { return !v.Holds(p, v.Self) && !keptForDead(v, p) }
}

func keptForDead(v *view.View, p partition.ID) bool {
	if len(v.Map.Removing) == 0 {
		return false
	}
	return slices.ContainsFunc(v.OldReplicas(p, nil), v.Dead)
}

// sleepCtx waits d, or less if ctx ends first (false).
// streamAll runs copyFrom for every source at once, each tried again
// after retry until it returns nil; it returns when every source
// succeeded, ctx ended, or one found a newer map installed
// (partcopy.ErrStale), which ends the others too (stale: true). Only
// when it returns false with ctx not done did every source succeed.
func streamAll(ctx context.Context, sources []int, retry time.Duration, copyFrom func(ctx context.Context, source int) error) (stale bool) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var found atomic.Bool
	var wg sync.WaitGroup
	for _, r := range sources {
		wg.Go(func() {
			for {
				err := copyFrom(ctx, r)
				switch {
				case err == nil, ctx.Err() != nil:
					return
				case errors.Is(err, partcopy.ErrStale):
					found.Store(true)
					stop()
					return
				}
				if !sleepCtx(ctx, retry) {
					return
				}
			}
		})
	}
	wg.Wait()
	return found.Load()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// cleanup deletes every partition this node does not hold in v, at the
// pace of mv.pace, then clears the store's pending-cleanup marker. A
// partition this node never held costs one seek of the index
// (store.Held). Cancelled (a newer map, Close), it leaves the marker set
// and the records not yet dropped indexed: the next cleanup, by the next
// map without a change or at the next start, drops them.
//
// It keeps a partition one of whose replicas in v the map counts dead
// (keptForDead): the change that moved the partition to that node ended
// without the node copying it.
func (mv *mover) cleanup(ctx context.Context, v *view.View) {
	s := mv.s
	pending, err := s.local.Store.CleanupPending()
	if err != nil {
		s.log.Error("membership: read the pending cleanup; dropping anyway", "err", err)
		pending = true
	}
	// The horizons first: at a start, a change's end whose reset did not
	// happen (an earlier release), or an earlier release's one horizon.
	if err := s.local.Store.ResetHorizons(notHeld(v)); err != nil {
		s.log.Error("membership: reset the horizons of the partitions not held; tried again at the next start", "err", err)
	}
	held, err := s.local.Store.Held(notHeld(v))
	if err != nil {
		s.log.Error("membership: find the partitions to drop; dropped at the next start", "err", err)
		return
	}
	start := time.Now()
	removed, parts := 0, 0
	for _, part := range held {
		n, err := s.local.DropPartition(ctx, part, mv.pace)
		removed += n
		s.m.moveDropped.Add(float64(n))
		if n > 0 {
			parts++
		}
		if ctx.Err() != nil {
			s.log.Info("membership: drop of the partitions not held stopped (a newer map, or the node stops); finished later", "epoch", v.Map.Epoch,
				"partitions", parts, "records", removed, "took", time.Since(start).Round(time.Millisecond))
			return
		}
		if err != nil {
			s.log.Error("membership: drop a partition no longer held; dropped at the next start", "partition", part, "err", err)
			return
		}
	}
	if pending {
		if err := s.local.Store.SetCleanupPending(false); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("clear the pending cleanup", "err", err)
		}
	}
	if pending || removed > 0 {
		s.log.Info("membership: dropped the partitions not held", "epoch", v.Map.Epoch, "partitions", parts, "records", removed,
			"took", time.Since(start).Round(time.Millisecond))
	}
}
