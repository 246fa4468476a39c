package antientropy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

var errDiffersStill = errors.New("keys left differing")

// Exchange compares this node's data of the partitions shared with peer i
// with the peer's and repairs both sides (see the package comment); with
// pullOnly, only this side (partitions a membership change moves here).
// It routes by v from start to end.
func (a *Service) Exchange(ctx context.Context, v *view.View, i int, shared []partition.ID, pullOnly bool) (st ExchangeStats, err error) {
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
			h, err := local.PartitionHash(part)
			if err != nil {
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
		if err := local.SegmentHashes(d.Part, &mine); err != nil {
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

// transfer moves the records of one exchange: aeWorkers goroutines take
// keys to pull or push and make the replica calls.
type transfer struct {
	a        *Service
	ctx      context.Context
	v        *view.View
	peer     int
	pullOnly bool
	jobs     chan transferJob
	wg       sync.WaitGroup

	mu sync.Mutex
	st *ExchangeStats
	// peerFull is set once the peer refused a push for want of storage
	// (store.ErrInsufficientStorage): the exchange's other pushes are
	// not sent, and are left differing.
	peerFull atomic.Bool
}

type transferJob struct {
	key  []byte
	pull bool
}

func (a *Service) newTransfer(ctx context.Context, v *view.View, peer int, st *ExchangeStats, pullOnly bool) *transfer {
	workers := aeWorkers
	if pullOnly {
		workers = moveWorkers
	}
	x := &transfer{a: a, ctx: ctx, v: v, peer: peer, pullOnly: pullOnly, jobs: make(chan transferJob, workers), st: st}
	x.wg.Add(workers)
	for range workers {
		go x.work()
	}
	return x
}

// finish waits for every queued key to be transferred.
func (x *transfer) finish() {
	close(x.jobs)
	x.wg.Wait()
}

// reconcile walks this node's entries of l's segment beside the peer's
// (both in key order) and queues the keys that differ.
func (x *transfer) reconcile(l rpc.SegmentList) error {
	theirs := l.Entries
	queue := func(key []byte, pull bool) error {
		if !pull && x.pullOnly {
			return nil
		}
		select {
		case x.jobs <- transferJob{key: bytes.Clone(key), pull: pull}:
			return nil
		case <-x.ctx.Done():
			return x.ctx.Err()
		}
	}
	err := x.a.local.Store.SegmentEntries(l.Part, int(l.Seg), func(_ uint8, key []byte, e store.IndexEntry) error {
		v := e.Version
		for len(theirs) > 0 && bytes.Compare(theirs[0].Key, key) < 0 {
			if err := queue(theirs[0].Key, true); err != nil { // only theirs
				return err
			}
			theirs = theirs[1:]
		}
		if len(theirs) > 0 && bytes.Equal(theirs[0].Key, key) {
			t := theirs[0].Version
			theirs = theirs[1:]
			switch {
			case t > v:
				return queue(key, true)
			case t < v:
				return queue(key, false)
			}
			return nil
		}
		return queue(key, false) // only mine
	})
	if err != nil {
		return err
	}
	for _, e := range theirs {
		if err := queue(e.Key, true); err != nil {
			return err
		}
	}
	return nil
}

func (x *transfer) work() {
	defer x.wg.Done()
	for j := range x.jobs {
		var n int
		var err error
		if j.pull {
			n, err = x.pull(j.key)
		} else {
			n, err = x.push(j.key)
		}
		x.mu.Lock()
		x.st.RecordBytes += n
		switch {
		case err != nil:
			x.st.Failed++
		case j.pull:
			x.st.Pulled++
		default:
			x.st.Pushed++
		}
		x.mu.Unlock()
		if err != nil && x.ctx.Err() == nil {
			x.a.log.Debug("anti-entropy transfer", "peer", x.v.URL(x.peer), "key", j.key, "pull", j.pull, "err", err)
		}
	}
}

// throttle waits for n bytes of the rate.
func (x *transfer) throttle(n int) error {
	return x.a.limit.WaitN(x.ctx, min(n, x.a.limit.Burst()))
}

// pull reads key from the peer and applies it here.
func (x *transfer) pull(key []byte) (int, error) {
	if w := x.a.o.Writable; w != nil {
		if err := w(); err != nil {
			return 0, fmt.Errorf("pull %q: %w", key, err)
		}
	}
	rec, found, err := x.v.Peers[x.peer].Get(key, x.v.Epoch(), time.Now().Add(x.a.o.Timeout))
	if err != nil {
		return 0, err
	}
	if !found { // it was listed: only a wipe of the peer's disk since removes it
		return 0, fmt.Errorf("pull %q: gone from the peer", key)
	}
	n := len(key) + rec.EncodedSize()
	if err := x.throttle(n); err != nil {
		return 0, err
	}
	// Below the horizon here (collected already) or older than what
	// this node holds by now: kept out, and done.
	return n, x.a.apply(x.v, key, &rec)
}

// push writes this node's record of key to the peer.
func (x *transfer) push(key []byte) (int, error) {
	if x.peerFull.Load() {
		return 0, fmt.Errorf("push %q: %w: the peer refused an earlier push for want of storage", key, store.ErrInsufficientStorage)
	}
	e, err := x.a.local.Get(key)
	if err != nil {
		return 0, err
	}
	if !e.Found {
		return 0, fmt.Errorf("push %q: gone from this node", key)
	}
	rec := record.Record{Version: e.Rec.Version, Tombstone: e.Rec.Tombstone, ExpiresAt: e.Rec.ExpiresAt, Value: e.Rec.Value}
	env := rec.Encode()
	if err := x.throttle(len(key) + len(env)); err != nil {
		return 0, err
	}
	if _, err := x.v.Peers[x.peer].Apply(key, env, x.v.Epoch(), time.Now().Add(x.a.o.Timeout)); err != nil {
		if errors.Is(err, store.ErrInsufficientStorage) {
			x.peerFull.Store(true)
		}
		return 0, err
	}
	return len(key) + len(env), nil
}
