package antientropy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

var errDiffersStill = errors.New("keys left differing")

// Exchange compares this node's data of the partitions shared with peer i
// with the peer's and repairs both sides (see the package comment); with
// pullOnly, only this side (partitions a membership change moves here).
// It routes by v from start to end.
//
// Its index walks are paced at the summaries' rate (SummaryLimiter),
// which paces the peer's too (paceWalk). The node's own exchanges share
// that limiter. A pull-only exchange, a change's comparison of the
// partitions it copied here with another replica of their old set, paces
// its walks on its own, at the limiter's rate of the moment (the
// background pace's factor included): the change compares with several
// old replicas at once (membership's compareAtOnce), each walked by this
// node's comparison no faster than by one exchange, and the walks of this
// node, which takes no reads of those partitions yet, add up.
func (a *Service) Exchange(ctx context.Context, v *view.View, i int, shared []partition.ID, pullOnly bool) (st ExchangeStats, err error) {
	walk := a.walk
	if pullOnly {
		walk = rate.NewLimiter(a.walk.Limit(), a.walk.Burst())
	}
	p := v.Peers[i]
	st = ExchangeStats{Peer: v.URL(i), Started: time.Now()}
	defer func() {
		st.Duration = time.Since(st.Started)
		if err != nil {
			st.Err = err.Error()
		}
	}()
	if a.rebuilding() {
		return st, errors.New("this node is rebuilding: its data is not its share yet")
	}
	local := a.local.Store
	local.AwaitCommits() // before any hash: what arrived before Started is in them
	st.Partitions = len(shared)
	summary := func(body []byte) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ans, err := p.Summary(body, v.Epoch(), time.Now().Add(a.o.SummaryTimeout))
		st.SummaryBytes += len(body) + len(ans)
		return ans, err
	}

	// 1. Partitions.
	var differing []rpc.SegmentHashes
	hashes := make([]uint64, 0, aePartitionsPerRequest)
	for len(shared) > 0 {
		chunk := shared[:min(len(shared), aePartitionsPerRequest)]
		shared = shared[len(chunk):]
		hashes = hashes[:0]
		for _, part := range chunk {
			h, walked, err := local.PartitionHash(part)
			if err != nil {
				return st, err
			}
			if err := a.paceWalk(ctx, walk, walked); err != nil {
				return st, err
			}
			hashes = append(hashes, h)
		}
		ans, err := summary(rpc.AppendPartitionsRequest(nil, chunk, hashes))
		if err != nil {
			return st, err
		}
		d, err := rpc.ParsePartitionsAnswer(ans, chunk)
		if err != nil {
			return st, fmt.Errorf("from %s: %w", st.Peer, err)
		}
		differing = append(differing, d...)
	}
	st.PartitionsDiffering = len(differing)

	// 2. Segments.
	var segs []rpc.Segment
	var mine [partition.Segments]uint64
	for _, d := range differing {
		walked, err := local.SegmentHashesWalked(d.Part, &mine)
		if err != nil {
			return st, err
		}
		if err := a.paceWalk(ctx, walk, walked); err != nil {
			return st, err
		}
		for s := range mine {
			if mine[s] != d.Hashes[s] {
				segs = append(segs, rpc.Segment{Part: d.Part, Seg: uint8(s)})
			}
		}
	}
	st.SegmentsDiffering = len(segs)
	a.setProgress(i, 0.1)

	// 3. Keys, segment by segment as the lists come.
	x := a.newTransfer(ctx, v, i, &st, pullOnly)
	total := len(segs)
	for len(segs) > 0 {
		chunk := segs[:min(len(segs), aeSegmentsPerRequest)]
		ans, err := summary(rpc.AppendSegmentsRequest(nil, chunk))
		if err != nil {
			x.finish()
			return st, err
		}
		lists, err := rpc.ParseSegmentsAnswer(ans, chunk, a.o.MaxKeyBytes)
		if err != nil {
			x.finish()
			return st, fmt.Errorf("from %s: %w", st.Peer, err)
		}
		for _, l := range lists {
			if err := x.reconcile(l); err != nil {
				x.finish()
				return st, err
			}
		}
		segs = segs[len(lists):]
		a.setProgress(i, 0.1+0.9*float64(total-len(segs))/float64(total))
	}
	x.finish()
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if st.Failed > 0 {
		return st, fmt.Errorf("%w: %d of them", errDiffersStill, st.Failed)
	}
	return st, nil
}

// transfer moves the records of one exchange in batches: reconcile
// gathers the keys to pull and those to push into batches of up to
// aeBatchKeys, and aeWorkers goroutines (moveWorkers for a pull-only
// exchange) each move one batch at a time. A pull batch starts every
// key's read at the peer at once (the peer client packs them into a few
// requests) and stores what comes back in one local commit; a push batch
// reads its records from the store, not through the read cache (a
// repair's read would fill it for no later hit), and starts every write
// at once, which the peer stores in as few commits. Per record this is a
// fraction of the replica call each record used to be, which cost about
// what a replicated write costs (docs/benchmarks.md section 23).
type transfer struct {
	a        *Service
	ctx      context.Context
	v        *view.View
	peer     int
	pullOnly bool
	jobs     chan transferJob
	wg       sync.WaitGroup
	// pending holds the batches reconcile is filling, pulls and pushes,
	// and segs lists this node's segments; only reconcile's goroutine
	// touches them.
	pending [2]transferJob
	segs    *store.SegmentReader

	mu sync.Mutex
	st *ExchangeStats
	// peerFull is set once the peer refused a push for want of storage
	// (store.ErrInsufficientStorage): the exchange's other pushes are
	// not sent, and are left differing.
	peerFull atomic.Bool
}

// transferJob is a batch of keys to pull, or to push, and the bytes of
// their keys.
type transferJob struct {
	keys  [][]byte
	bytes int
	pull  bool
}

func (a *Service) newTransfer(ctx context.Context, v *view.View, peer int, st *ExchangeStats, pullOnly bool) *transfer {
	workers := aeWorkers
	if pullOnly {
		workers = moveWorkers
	}
	x := &transfer{a: a, ctx: ctx, v: v, peer: peer, pullOnly: pullOnly, jobs: make(chan transferJob, workers), st: st, segs: a.local.Store.NewSegmentReader()}
	x.pending[0].pull, x.pending[1].pull = true, false
	x.wg.Add(workers)
	for range workers {
		go x.work()
	}
	return x
}

// finish queues the batches not yet full (unless the exchange was
// cancelled) and waits for every queued key to be transferred.
func (x *transfer) finish() {
	if err := x.segs.Close(); err != nil {
		x.a.log.Warn("anti-entropy: closing the index iterator", "err", err)
	}
	for i := range x.pending {
		if len(x.pending[i].keys) > 0 {
			x.send(i)
		}
	}
	close(x.jobs)
	x.wg.Wait()
}

// queue adds key to the batch of its direction, sending the batch to
// the workers once it is full.
func (x *transfer) queue(key []byte, pull bool) error {
	if !pull && x.pullOnly {
		return nil
	}
	i := 1
	if pull {
		i = 0
	}
	j := &x.pending[i]
	j.keys = append(j.keys, bytes.Clone(key))
	j.bytes += len(key)
	if len(j.keys) < aeBatchKeys && j.bytes < aeBatchKeyBytes {
		return nil
	}
	return x.send(i)
}

// send hands pending batch i to the workers and starts a new one.
func (x *transfer) send(i int) error {
	j := x.pending[i]
	x.pending[i] = transferJob{pull: j.pull}
	select {
	case x.jobs <- j:
		return nil
	case <-x.ctx.Done():
		return x.ctx.Err()
	}
}

// reconcile walks this node's entries of l's segment beside the peer's
// (both in key order) and queues the keys that differ.
func (x *transfer) reconcile(l rpc.SegmentList) error {
	theirs := l.Entries
	err := x.segs.Entries(l.Part, int(l.Seg), func(_ uint8, key []byte, e store.IndexEntry) error {
		v := e.Version
		for len(theirs) > 0 && bytes.Compare(theirs[0].Key, key) < 0 {
			if err := x.queue(theirs[0].Key, true); err != nil { // only theirs
				return err
			}
			theirs = theirs[1:]
		}
		if len(theirs) > 0 && bytes.Equal(theirs[0].Key, key) {
			t := theirs[0].Version
			theirs = theirs[1:]
			switch {
			case t > v:
				return x.queue(key, true)
			case t < v:
				return x.queue(key, false)
			}
			return nil
		}
		return x.queue(key, false) // only mine
	})
	if err != nil {
		return err
	}
	for _, e := range theirs {
		if err := x.queue(e.Key, true); err != nil {
			return err
		}
	}
	return nil
}

func (x *transfer) work() {
	defer x.wg.Done()
	b := new(transferBatch)
	for j := range x.jobs {
		var moved, failed, n int
		var err error
		if j.pull {
			moved, n, err = x.pull(b, j.keys)
		} else {
			moved, n, err = x.push(b, j.keys)
		}
		failed = len(j.keys) - moved
		x.mu.Lock()
		x.st.RecordBytes += n
		x.st.Failed += failed
		if j.pull {
			x.st.Pulled += moved
		} else {
			x.st.Pushed += moved
		}
		x.mu.Unlock()
		if err != nil && x.ctx.Err() == nil {
			x.a.log.Debug("anti-entropy transfer", "peer", x.v.URL(x.peer), "keys", len(j.keys), "failed", failed, "pull", j.pull, "err", err)
		}
	}
}

// transferBatch is one worker's scratch, reused from batch to batch.
type transferBatch struct {
	calls    []view.Call
	done     chan *view.Call
	writes   []store.Write
	recs     []record.Record
	outcomes []replica.Outcome
}

// start starts one call per key at the peer (envs[i] the record to write
// for keys[i], or nil envs: reads) and waits for all of them; the calls
// are b.calls, in keys' order.
func (x *transfer) start(b *transferBatch, keys, envs [][]byte) {
	if cap(b.done) < len(keys) {
		b.done = make(chan *view.Call, len(keys))
	}
	b.calls = slices.Grow(b.calls[:0], len(keys))[:len(keys)]
	p, epoch, deadline := x.v.Peers[x.peer], x.v.Epoch(), time.Now().Add(x.a.o.Timeout)
	for i, key := range keys {
		c := &b.calls[i]
		// A pull's read is background work: the peer does not cache it.
		*c = view.Call{Key: key, Epoch: epoch, Deadline: deadline, Done: b.done, Background: envs == nil}
		if envs != nil {
			c.Env = envs[i]
		}
		view.Go(p, c)
	}
	for range keys {
		<-b.done
	}
}

// throttle waits for n bytes of the rate.
func (x *transfer) throttle(n int) error {
	return pace.WaitBytes(x.ctx, x.a.limit, n)
}

// pull reads keys from the peer and stores them here in one commit; it
// returns how many were stored (or were older than what this node holds
// by now, or below its horizon: kept out, and done) and their bytes.
func (x *transfer) pull(b *transferBatch, keys [][]byte) (moved, n int, err error) {
	if w := x.a.o.Writable; w != nil {
		if err := w(); err != nil {
			return 0, 0, fmt.Errorf("pull %d keys: %w", len(keys), err)
		}
	}
	x.start(b, keys, nil)
	b.writes, b.recs = b.writes[:0], slices.Grow(b.recs[:0], len(keys))
	for i := range b.calls {
		c := &b.calls[i]
		switch {
		case c.Err != nil:
			err = c.Err
			continue
		case !c.Found: // it was listed: only a wipe of the peer's disk since removes it
			err = fmt.Errorf("pull %q: gone from the peer", c.Key)
			continue
		}
		b.recs = append(b.recs, c.Rec)
		b.writes = append(b.writes, store.Write{Key: c.Key, Rec: &b.recs[len(b.recs)-1]})
		n += len(c.Key) + c.Rec.EncodedSize()
	}
	if len(b.writes) == 0 {
		return 0, 0, err
	}
	if terr := x.throttle(n); terr != nil {
		return 0, 0, terr
	}
	b.outcomes, err = x.a.apply(x.v, b.writes, b.outcomes)
	if err != nil {
		return 0, 0, err
	}
	for _, o := range b.outcomes {
		if o.Refused != nil {
			err = o.Refused
			continue
		}
		moved++
	}
	return moved, n, err
}

// push writes this node's records of keys to the peer, aeBatchBytes of
// records at a time; it returns how many the peer stored (or held newer)
// and their bytes.
func (x *transfer) push(b *transferBatch, keys [][]byte) (moved, n int, err error) {
	send, envs, size := keys[:0:0], make([][]byte, 0, len(keys)), 0
	flush := func() {
		if len(send) == 0 {
			return
		}
		m, sent, ferr := x.pushOut(b, send, envs, size)
		moved, n = moved+m, n+sent
		if ferr != nil {
			err = ferr
		}
		send, envs, size = send[:0], envs[:0], 0
	}
	for _, key := range keys {
		env, found, rerr := x.a.local.Store.AppendEnvelope(nil, key)
		switch {
		case rerr != nil:
			err = rerr
			continue
		case !found:
			err = fmt.Errorf("push %q: gone from this node", key)
			continue
		}
		send, envs = append(send, key), append(envs, env)
		if size += len(key) + len(env); size >= aeBatchBytes {
			flush()
		}
	}
	flush()
	return moved, n, err
}

// pushOut sends envs, the records of keys (size bytes in all), to the
// peer at once.
func (x *transfer) pushOut(b *transferBatch, keys, envs [][]byte, size int) (moved, n int, err error) {
	if x.peerFull.Load() {
		return 0, 0, fmt.Errorf("push %d keys: %w: the peer refused an earlier push for want of storage", len(keys), store.ErrInsufficientStorage)
	}
	if err := x.throttle(size); err != nil {
		return 0, 0, err
	}
	x.start(b, keys, envs)
	for i := range b.calls {
		c := &b.calls[i]
		if c.Err != nil {
			if errors.Is(c.Err, store.ErrInsufficientStorage) {
				x.peerFull.Store(true)
			}
			err = c.Err
			continue
		}
		moved++
		n += len(c.Key) + len(c.Env)
	}
	return moved, n, err
}

// paceWalk waits until walk, the summaries' limiter or a pull-only
// exchange's own, allows walked more index entries read: the next
// partition's hashes, and the peer's summary of it, which is asked for
// only then, wait for this one's. An exchange's own limiter follows the
// summaries' (the background pace sets that one's rate).
func (a *Service) paceWalk(ctx context.Context, walk *rate.Limiter, walked int) error {
	if walked == 0 {
		return nil
	}
	if walk != a.walk {
		if l := a.walk.Limit(); walk.Limit() != l {
			walk.SetLimit(l)
		}
	}
	if err := pace.WaitBytes(ctx, walk, walked); err != nil {
		return fmt.Errorf("anti-entropy summaries: %w", err)
	}
	return nil
}
