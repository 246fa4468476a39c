package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Anti-entropy
//
// Read repair fixes only keys that are read, and hints only writes whose
// coordinator lived to deliver them within the window. Anti-entropy is
// what guarantees convergence: every node regularly compares what it holds
// with each peer that shares partitions with it, and the two exchange the
// records that differ, newest version winning in both directions.
//
// One exchange with a peer (exchange):
//
//  1. partitions: for every partition both replicate, this node sends its
//     partition hash; the peer answers the segment hashes of those whose
//     hash differs (rpc.SumPartitions);
//  2. segments: this node compares segment hashes and asks for the
//     (key, version) lists of the segments that differ (rpc.SumSegments);
//  3. keys: it walks its own list of each such segment beside the peer's;
//     a key the peer holds newer (or only the peer holds) is read from the
//     peer and applied here, a key held newer here is written to the peer,
//     both with ordinary replica calls, throttled to Rate bytes a second.
//
// Summaries come from the store's index (store.SegmentHashes): hashing
// reads no values, and the traffic is proportional to the difference: two
// replicas in step exchange 10 bytes a partition and nothing else.
// Records go through the same checks as any replicated write: the clock
// observes a pulled version first (one too far ahead is left out), and
// the peer refuses a pushed one it holds newer.
//
// Schedule: each node starts an exchange with each of its peers every
// Interval, at most Concurrency at once, the first at a random time within
// min(Interval, 5 min) of its start so that a node that was down compares
// soon, and peers do not all start together. A failed exchange is retried
// after a minute. Both nodes of a pair start exchanges, so every pair is
// compared at least once an Interval while either of them runs. Repair
// (the admin endpoint) runs an exchange with every peer now, within the
// same Concurrency; a peer whose hints were dropped is compared within a
// minute (soon).

// AntiEntropyOptions configures anti-entropy. Zero fields take the
// defaults noted.
type AntiEntropyOptions struct {
	// Interval is how often this node compares its data with each peer
	// (--ae-interval; default 1 h). Negative: never on a schedule, only on
	// demand (Repair) and after dropped hints.
	Interval time.Duration
	// Rate is the most record bytes a second pulled from and pushed to
	// peers, together (--ae-rate; default 8 MiB/s). Summaries are not
	// counted: they are small next to the records they spare.
	Rate int64
	// Concurrency is how many peers are compared at once (--ae-concurrency;
	// default 1).
	Concurrency int
}

func (o *AntiEntropyOptions) defaults() {
	if o.Interval == 0 {
		o.Interval = time.Hour
	}
	if o.Rate <= 0 {
		o.Rate = 8 << 20
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
}

const (
	// aeFirstWithin bounds the random delay of the first exchange with
	// each peer after a start.
	aeFirstWithin = 5 * time.Minute
	// aeRetry is the wait after a failed exchange, and the delay of an
	// exchange asked for by soon.
	aeRetry = time.Minute
	// aeWorkers is how many replica calls one exchange keeps in flight
	// (the peer client batches them); moveWorkers, one that copies
	// partitions a node gains (move.go), which pulls every record of
	// them: more calls in flight make larger batches and let Pebble
	// group more of the local commits under one fsync.
	aeWorkers   = 32
	moveWorkers = 128
	// aePartitionsPerRequest and aeSegmentsPerRequest bound the summary
	// requests (10 and 3 bytes an item).
	aePartitionsPerRequest = 1024
	aeSegmentsPerRequest   = 1024
)

// ExchangeStats is what one exchange found and did.
type ExchangeStats struct {
	Peer                string        `json:"peer"`
	Started             time.Time     `json:"started"`
	Duration            time.Duration `json:"duration_ns"`
	Partitions          int           `json:"partitions"` // compared
	PartitionsDiffering int           `json:"partitions_differing"`
	SegmentsDiffering   int           `json:"segments_differing"`
	Pulled              int           `json:"pulled"`        // keys repaired here
	Pushed              int           `json:"pushed"`        // keys repaired at the peer
	Failed              int           `json:"failed"`        // keys left differing (a failed call, a version refused)
	SummaryBytes        int           `json:"summary_bytes"` // summary requests and answers
	RecordBytes         int           `json:"record_bytes"`  // keys and envelopes pulled and pushed
	Err                 string        `json:"error,omitempty"`
}

// PeerSync is anti-entropy's state with one peer, for status.
type PeerSync struct {
	Peer string `json:"peer"`
	// LastSuccess is when the last exchange that left nothing differing
	// started (zero: none since this node started).
	LastSuccess time.Time      `json:"last_success"`
	Running     bool           `json:"running"`
	Progress    float64        `json:"progress"` // of the running exchange, 0 to 1
	Last        *ExchangeStats `json:"last,omitempty"`
}

type antiEntropy struct {
	c     *Coordinator
	o     AntiEntropyOptions
	limit *rate.Limiter
	sem   chan struct{} // Concurrency slots
	wake  chan struct{}

	mu      sync.Mutex
	due     []time.Time // per node; zero for self
	state   []PeerSync  // per node
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func newAntiEntropy(c *Coordinator, o AntiEntropyOptions) *antiEntropy {
	o.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	a := &antiEntropy{
		c: c, o: o, ctx: ctx, cancel: cancel,
		// A second's worth at most at once; a larger record waits for a
		// full bucket.
		limit: rate.NewLimiter(rate.Limit(o.Rate), int(o.Rate)),
		sem:   make(chan struct{}, o.Concurrency),
		wake:  make(chan struct{}, 1),
		due:   make([]time.Time, membership.MaxNodeID+1),
		state: make([]PeerSync, membership.MaxNodeID+1),
	}
	a.started = time.Now()
	return a
}

// members schedules the first exchange with every peer of v not yet
// scheduled: at start, and when a node joins.
func (a *antiEntropy) members(v *view) {
	a.mu.Lock()
	now := time.Now()
	for _, i := range v.others() {
		a.state[i].Peer = v.url(i)
		if a.due[i].IsZero() && !a.state[i].Running && a.o.Interval > 0 {
			a.due[i] = now.Add(rand.N(min(a.o.Interval, aeFirstWithin)))
		}
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *antiEntropy) start() {
	a.done.Add(1)
	go a.run()
}

func (a *antiEntropy) close() {
	a.cancel()
	a.done.Wait()
}

// run starts the exchanges that are due, each in its own goroutine within
// the Concurrency slots, and sleeps until the next is due.
func (a *antiEntropy) run() {
	defer a.done.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := a.startDue()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 10*time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-a.ctx.Done():
			return
		case <-a.wake:
		case <-timer.C:
		}
	}
}

// startDue starts every exchange that is due and has a free slot, and
// returns when the next one is due (zero: none scheduled).
func (a *antiEntropy) startDue() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	v := a.c.v()
	var next time.Time
	for i, d := range a.due {
		if d.IsZero() || a.state[i].Running || v.peers[i] == nil {
			continue
		}
		if d.After(now) {
			if next.IsZero() || d.Before(next) {
				next = d
			}
			continue
		}
		select {
		case a.sem <- struct{}{}:
		default:
			return now.Add(time.Second) // all slots busy: look again soon
		}
		a.state[i].Running, a.state[i].Progress = true, 0
		a.done.Add(1)
		go func() {
			defer a.done.Done()
			defer func() { <-a.sem }()
			a.runExchange(i)
		}()
	}
	return next
}

// runExchange runs one exchange with peer i and schedules the next.
func (a *antiEntropy) runExchange(i int) ExchangeStats {
	v := a.c.v()
	st, err := a.exchange(a.ctx, v, i, v.Shared(v.self, i), false)
	a.mu.Lock()
	s := &a.state[i]
	s.Running, s.Last = false, &st
	switch {
	case err == nil:
		s.LastSuccess, s.Progress = st.Started, 1
		if a.o.Interval > 0 {
			a.due[i] = time.Now().Add(a.o.Interval)
		} else {
			a.due[i] = time.Time{}
		}
	case a.ctx.Err() == nil:
		a.due[i] = time.Now().Add(aeRetry)
	}
	a.mu.Unlock()
	if err == nil {
		a.c.m.aeProgress.WithLabelValues(st.Peer).Set(1)
	}
	a.c.m.observeExchange(st, err)
	level := a.c.log.Info
	if err != nil {
		level = a.c.log.Warn
	}
	if err != nil || st.Pulled+st.Pushed > 0 {
		level("anti-entropy exchange", "peer", st.Peer, "partitions_differing", st.PartitionsDiffering,
			"pulled", st.Pulled, "pushed", st.Pushed, "failed", st.Failed, "took", st.Duration.Round(time.Millisecond), "err", err)
	}
	return st
}

// soon schedules an exchange with peer i within aeRetry (sooner if one
// was due sooner).
func (a *antiEntropy) soon(i int) {
	a.mu.Lock()
	if d := time.Now().Add(aeRetry); a.due[i].IsZero() || d.Before(a.due[i]) {
		a.due[i] = d
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Repair runs an exchange with every peer now and returns their outcomes
// (an exchange already running with a peer is not started twice: that
// peer's entry then says so). They take the Concurrency slots like
// scheduled ones: one at a time by default, so that a record this node
// missed is pulled from the first peer that has it, not from each. ctx
// bounds the wait, not the exchanges, which end on their own or at Close.
func (c *Coordinator) Repair(ctx context.Context) []ExchangeStats {
	a := c.ae
	v := c.v()
	out := make([]ExchangeStats, len(v.peers))
	var wg sync.WaitGroup
	a.mu.Lock()
	for i := range v.peers {
		if v.peers[i] == nil {
			continue
		}
		if a.state[i].Running {
			out[i] = ExchangeStats{Peer: v.url(i), Err: "an exchange with this peer is already running"}
			continue
		}
		a.state[i].Running, a.state[i].Progress = true, 0
		wg.Add(1)
		a.done.Add(1)
		go func() {
			defer a.done.Done()
			defer wg.Done()
			select {
			case a.sem <- struct{}{}:
			case <-a.ctx.Done():
				a.mu.Lock()
				a.state[i].Running = false
				a.mu.Unlock()
				out[i] = ExchangeStats{Peer: v.url(i), Err: "node stopping"}
				return
			}
			defer func() { <-a.sem }()
			out[i] = a.runExchange(i)
		}()
	}
	a.mu.Unlock()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
		return nil
	}
	res := out[:0]
	for i, st := range out {
		if v.peers[i] != nil {
			res = append(res, st)
		}
	}
	return res
}

// AntiEntropy returns anti-entropy's state with every peer.
func (c *Coordinator) AntiEntropy() []PeerSync {
	a := c.ae
	v := c.v()
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []PeerSync
	for _, i := range v.others() {
		out = append(out, a.state[i])
	}
	return out
}

// syncedSince returns, per node, when the last exchange with it that left
// nothing differing started (zero: none since this node started; zero for
// this node too).
func (a *antiEntropy) syncedSince() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]time.Time, len(a.state))
	for i, s := range a.state {
		out[i] = s.LastSuccess
	}
	return out
}

// warnings names the peers with which no exchange succeeded for two
// intervals (since this node started, or since the last success): the
// schedule is not keeping the replicas in step.
func (a *antiEntropy) warnings(now time.Time) []string {
	if a.o.Interval <= 0 {
		return nil
	}
	v := a.c.v()
	a.mu.Lock()
	defer a.mu.Unlock()
	var ws []string
	for _, i := range v.others() {
		s := a.state[i]
		since := a.started
		if v.since.After(since) {
			since = v.since
		}
		if s.LastSuccess.After(since) {
			since = s.LastSuccess
		}
		if now.Sub(since) > 2*a.o.Interval {
			ws = append(ws, fmt.Sprintf("anti-entropy: no complete exchange with %s for %v", s.Peer, now.Sub(since).Round(time.Second)))
		}
	}
	return ws
}

func (a *antiEntropy) setProgress(i int, f float64) {
	a.mu.Lock()
	a.state[i].Progress = f
	a.mu.Unlock()
	a.c.m.aeProgress.WithLabelValues(a.state[i].Peer).Set(f)
}

var errDiffersStill = errors.New("keys left differing")

// exchange compares this node's data of partitions shared with peer i's
// and repairs both sides (see the comment at the top of the file); with
// pullOnly, only this side (a partition moving here, move.go).
func (a *antiEntropy) exchange(ctx context.Context, v *view, i int, shared []partition.ID, pullOnly bool) (st ExchangeStats, err error) {
	c := a.c
	p := v.peers[i].client
	st = ExchangeStats{Peer: v.url(i), Started: time.Now()}
	defer func() {
		st.Duration = time.Since(st.Started)
		if err != nil {
			st.Err = err.Error()
		}
	}()
	if c.Rebuilding() {
		return st, errors.New("this node is rebuilding: its data is not its share yet")
	}
	local := c.local.Store
	st.Partitions = len(shared)
	summary := func(body []byte) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ans, err := p.Summary(body, v.m.Epoch, time.Now().Add(c.summaryTimeout))
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
		lists, err := rpc.ParseSegmentsAnswer(ans, chunk, c.maxKeyBytes)
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
	a        *antiEntropy
	ctx      context.Context
	v        *view
	peer     int
	pullOnly bool
	jobs     chan transferJob
	wg       sync.WaitGroup

	mu sync.Mutex
	st *ExchangeStats
}

type transferJob struct {
	key  []byte
	pull bool
}

func (a *antiEntropy) newTransfer(ctx context.Context, v *view, peer int, st *ExchangeStats, pullOnly bool) *transfer {
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
	err := x.a.c.local.Store.SegmentEntries(l.Part, int(l.Seg), func(_ uint8, key []byte, e store.IndexEntry) error {
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
			x.a.c.log.Debug("anti-entropy transfer", "peer", x.v.url(x.peer), "key", j.key, "pull", j.pull, "err", err)
		}
	}
}

// throttle waits for n bytes of the rate.
func (x *transfer) throttle(n int) error {
	return x.a.limit.WaitN(x.ctx, min(n, x.a.limit.Burst()))
}

// pull reads key from the peer and applies it here.
func (x *transfer) pull(key []byte) (int, error) {
	c := x.a.c
	rec, found, err := x.v.peers[x.peer].client.Get(key, x.v.m.Epoch, time.Now().Add(c.timeout))
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
	// Below the horizon here (collected already, gc.go) or older than
	// what this node holds by now: kept out, and done.
	return n, c.applyRemote(x.v, key, &rec)
}

// push writes this node's record of key to the peer.
func (x *transfer) push(key []byte) (int, error) {
	c := x.a.c
	e, err := c.local.Get(key)
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
	if _, err := x.v.peers[x.peer].client.Apply(key, env, x.v.m.Epoch, time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return len(key) + len(env), nil
}
