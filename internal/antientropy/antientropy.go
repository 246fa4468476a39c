// Package antientropy compares this node's data with each peer's that
// shares partitions with it, and exchanges the records that differ
// (anti-entropy), on a schedule, on demand, and for the partitions a
// membership change moves to this node, after they were streamed from one
// of their replicas (pulling only).
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
//     both with ordinary replica calls, started a batch of keys at once
//     (the peer client packs them into a few requests; a pulled batch is
//     stored in one commit), throttled to Rate bytes a second.
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
//
// While a membership change is under way, until it reaches read-new, an
// exchange on the schedule or by Repair leaves out the partitions either
// node gains in the change (placement.Sets.Compared): the change copies
// them itself, and comparing them beside its stream would send the same
// records twice to the node the stream is filling. Such an exchange is
// followed by another with the same peer within a minute, until one
// compares every partition both replicate: soon after read-new.
package antientropy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/sizeflag"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures anti-entropy. Zero fields take the defaults noted
// (EnsureDefaults), but Interval.
type Options struct {
	// Interval is how often this node compares its data with each peer
	// (--ae-interval, whose default is 1 h). 0: never on a schedule, only
	// on demand (Repair) and after dropped hints.
	Interval time.Duration
	// Rate is the most record bytes a second pulled from and pushed to
	// peers, together (--ae-rate; default 8 MiB/s). The summaries' bytes
	// are not counted: they are few next to the records they spare (their
	// index reads are, SummaryRate).
	Rate int64
	// SummaryRate is the most index entries a second this node's
	// exchanges read to hash the partitions they compare, together, and
	// each pull-only exchange (a membership change's comparison) apart
	// (--ae-summary-rate; default DefaultSummaryRate). Under writes every
	// partition's hashes are stale, and an exchange reads the node's
	// whole index; unpaced, exchanges started on several nodes at once
	// took the CPU from requests for a fifth of a second
	// (docs/benchmarks.md section 47). A peer's summaries are read as
	// the exchange asks for them, so this paces both ends.
	SummaryRate int
	// Concurrency is how many peers are compared at once (--ae-concurrency;
	// default 1).
	Concurrency int
	// Timeout is one replica call's deadline (the node's
	// --replica-timeout; default 300 ms).
	Timeout time.Duration
	// SummaryTimeout bounds one summary exchange with a peer, which may
	// have to read a whole index partition by partition (default 30 s).
	SummaryTimeout time.Duration
	// MaxKeyBytes bounds the keys a peer's segment lists may carry (the
	// node's --max-key-bytes; default 1024).
	MaxKeyBytes int
	// Writable reports whether this node's store takes writes now
	// (store.Store.Writable: not while its volume is below
	// --min-free-space, nor once it failed a write); nil: always. A pull
	// is not tried while it does not, since its record would be refused,
	// and the exchange ends with the keys left differing, to be compared
	// again at the next one.
	Writable func() error
}

// DefaultSummaryRate is Options.SummaryRate's default, the garbage
// collector's (gc.DefaultRate): an index entry costs about half a
// microsecond to read, so an exchange reads at most about a tenth of a
// core's worth, and a node's index of 10M entries in under a minute.
const DefaultSummaryRate = 200_000

// DefaultOptions returns the defaults the fields document, an hour's
// Interval.
func DefaultOptions() Options {
	o := Options{Interval: time.Hour}
	o.EnsureDefaults()
	return o
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Interval, "ae-interval", o.Interval, "how often anti-entropy compares this node's data with each peer (0: only on demand, POST /repair on the admin port)")
	sizeflag.Var(fs, &o.Rate, "ae-rate", "most records anti-entropy pulls and pushes per second, a `size`")
	fs.IntVar(&o.SummaryRate, "ae-summary-rate", o.SummaryRate, "most index `entries` a second anti-entropy reads to hash the partitions it compares; slowed down to an eighth while requests wait for the CPU (--background-sched-latency)")
	fs.IntVar(&o.Concurrency, "ae-concurrency", o.Concurrency, "peers anti-entropy compares at once")
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.Interval < 0 || o.Rate <= 0 || o.Concurrency < 1 || o.SummaryRate < 0 {
		return errors.New("--ae-interval must not be negative, --ae-rate and --ae-summary-rate must be positive and --ae-concurrency at least 1")
	}
	return nil
}

// EnsureDefaults fills the zero fields but Interval with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Interval < 0 {
		o.Interval = 0
	}
	if o.Rate <= 0 {
		o.Rate = 8 << 20
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.SummaryRate <= 0 {
		o.SummaryRate = DefaultSummaryRate
	}
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
	if o.SummaryTimeout <= 0 {
		o.SummaryTimeout = 30 * time.Second
	}
	if o.MaxKeyBytes <= 0 {
		o.MaxKeyBytes = 1024
	}
}

const (
	// aeFirstWithin bounds the random delay of the first exchange with
	// each peer after a start.
	aeFirstWithin = 5 * time.Minute
	// aeRetry is the wait after a failed exchange, and the delay of an
	// exchange asked for by soon.
	aeRetry = time.Minute
	// aeWorkers is how many batches of keys one exchange moves at once,
	// each of up to aeBatchKeys keys (aeBatchKeyBytes of keys) and, for
	// pushes, sent aeBatchBytes of records at a time; moveWorkers, one
	// that compares partitions a node gains after their stream (a
	// pull-only Exchange), which pulls what the stream's source lacked.
	// At most workers x aeBatchKeys records are held at once (128 and
	// 256: a pull learns a record's size only when it arrives).
	aeWorkers       = 4
	moveWorkers     = 8
	aeBatchKeys     = 32
	aeBatchKeyBytes = 16 << 10
	aeBatchBytes    = 256 << 10
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
	LastSuccess time.Time `json:"last_success"`
	// Incarnation is the peer's before and after that exchange
	// (view.Synced; 0: they differed, or either was not known).
	Incarnation uint64         `json:"-"`
	Running     bool           `json:"running"`
	Progress    float64        `json:"progress"` // of the running exchange, 0 to 1
	Last        *ExchangeStats `json:"last,omitempty"`
}

// ApplyFunc stores ws, records that a peer's replica holds, on this
// node's replica in one commit, routed by v: replica.ApplyRemote under
// v's map gate, with its outcomes (one per write, into out). A version
// the replica holds newer is not an error; one it refuses is that
// write's Outcome.Refused.
type ApplyFunc func(v *view.View, ws []store.Write, out []replica.Outcome) ([]replica.Outcome, error)

// Service runs the exchanges of one node. Its methods are safe for
// concurrent use.
type Service struct {
	local      *replica.Replica
	views      func() *view.View
	apply      ApplyFunc
	rebuilding func() bool
	o          Options
	limit      *rate.Limiter
	walk       *rate.Limiter // the summaries' index reads (SummaryRate)
	sem        chan struct{} // Concurrency slots
	wake       chan struct{}
	log        *slog.Logger
	m          *metrics
	work       *worker.Group

	mu      sync.Mutex
	due     []time.Time // per node; zero for self
	state   []PeerSync  // per node
	started time.Time
}

// New returns the anti-entropy of local with the peers of the views views
// returns, storing pulled records with apply; while rebuilding reports
// true (nil: never), this node's data is not its share yet, and no
// exchange runs. Start starts the schedule.
func New(local *replica.Replica, views func() *view.View, apply ApplyFunc, rebuilding func() bool, o Options, log *slog.Logger) *Service {
	o.EnsureDefaults()
	if rebuilding == nil {
		rebuilding = func() bool { return false }
	}
	return &Service{
		local: local, views: views, apply: apply, rebuilding: rebuilding, o: o, log: log, m: newMetrics(), work: worker.New(),
		// A sixteenth of a second's worth at once (at least 64 KiB): the
		// bucket is full when an exchange begins moving records, and a
		// second's worth, 8 MiB at the default rate whatever the pace's
		// factor, went out in one burst (docs/benchmarks.md section 47). A
		// larger record waits in steps (pace.WaitBytes).
		limit: rate.NewLimiter(rate.Limit(o.Rate), int(max(o.Rate/16, 64<<10))),
		// A sixteenth of a second's worth at once: a partition's walk
		// waits in steps of that (pace.WaitBytes).
		walk:    rate.NewLimiter(rate.Limit(o.SummaryRate), max(o.SummaryRate/16, 1)),
		sem:     make(chan struct{}, o.Concurrency),
		wake:    make(chan struct{}, 1),
		due:     make([]time.Time, clustermap.MaxNodeID+1),
		state:   make([]PeerSync, clustermap.MaxNodeID+1),
		started: time.Now(),
	}
}

// Limiter is the rate limiter of the exchanges' records (Rate), for the
// node's background pace (package pace) to govern.
func (a *Service) Limiter() *rate.Limiter { return a.limit }

// SummaryLimiter is the rate limiter of the exchanges' index reads
// (SummaryRate), for the node's background pace to govern.
func (a *Service) SummaryLimiter() *rate.Limiter { return a.walk }

// Register adds the instruments to reg.
func (a *Service) Register(reg prometheus.Registerer) { a.m.register(reg) }

// Members schedules the first exchange with every peer of v not yet
// scheduled: at start, and when a node joins.
func (a *Service) Members(v *view.View) {
	a.mu.Lock()
	now := time.Now()
	for _, i := range v.Others() {
		a.state[i].Peer = v.URL(i)
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

// Start runs the schedule; Close stops it and every exchange.
func (a *Service) Start() { a.work.Go(a.run) }

// Close stops the schedule and waits for the running exchanges to stop.
func (a *Service) Close() { a.work.Stop() }

// run starts the exchanges that are due, each in its own goroutine within
// the Concurrency slots, and sleeps until the next is due.
func (a *Service) run(ctx context.Context) {
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
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-timer.C:
		}
	}
}

// startDue starts every exchange that is due and has a free slot, and
// returns when the next one is due (zero: none scheduled).
func (a *Service) startDue() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	v := a.views()
	var next time.Time
	for i, d := range a.due {
		if d.IsZero() || a.state[i].Running || v.Peers[i] == nil {
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
		a.work.Go(func(context.Context) {
			defer func() { <-a.sem }()
			a.runExchange(i)
		})
	}
	return next
}

// runExchange runs one exchange with peer i and schedules the next.
func (a *Service) runExchange(i int) ExchangeStats {
	v := a.views()
	parts := v.Compared(v.Self, i)
	// Partitions left out (a change under way, before read-new) are
	// compared by the next exchange, within a minute: soon after the
	// change reaches read-new, also for a peer whose hints were dropped.
	partial := v.Moving && !v.ReadNew && len(parts) < len(v.Shared(v.Self, i))
	before := incarnation(v, i)
	st, err := a.Exchange(a.work.Context(), v, i, parts, false)
	after := incarnation(v, i)
	a.mu.Lock()
	s := &a.state[i]
	s.Running, s.Last = false, &st
	switch {
	case err == nil:
		s.LastSuccess, s.Progress = st.Started, 1
		s.Incarnation = 0
		if before == after {
			s.Incarnation = before
		} else {
			partial = true // the peer restarted during it: again soon
		}
		if partial {
			a.due[i] = time.Now().Add(aeRetry)
		} else if a.o.Interval > 0 {
			a.due[i] = time.Now().Add(a.o.Interval)
		} else {
			a.due[i] = time.Time{}
		}
	case !a.work.Stopping():
		a.due[i] = time.Now().Add(aeRetry)
	}
	a.mu.Unlock()
	if err == nil {
		a.m.progress.WithLabelValues(st.Peer).Set(1)
	}
	a.m.observeExchange(st, err)
	level := a.log.Info
	if err != nil {
		level = a.log.Warn
	}
	if err != nil || st.Pulled+st.Pushed > 0 {
		level("anti-entropy exchange", "peer", st.Peer, "partitions_differing", st.PartitionsDiffering,
			"pulled", st.Pulled, "pushed", st.Pushed, "failed", st.Failed, "took", st.Duration.Round(time.Millisecond), "err", err)
	}
	return st
}

// incarnation asks peer i of v which process answers (a ping; 0: none
// answered, or one that does not say).
func incarnation(v *view.View, i int) uint64 {
	a, err := v.Peers[i].Ping(v.Epoch(), time.Now().Add(pingTimeout))
	if err != nil {
		return 0
	}
	return a.Incarnation
}

// pingTimeout bounds incarnation's ping (the peer's own timeout, the
// node's --replica-timeout, bounds it further).
const pingTimeout = 5 * time.Second

// Soon schedules an exchange with peer i within a minute (sooner if one
// was due sooner): after a hint for it was dropped.
func (a *Service) Soon(i int) {
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
func (a *Service) Repair(ctx context.Context) []ExchangeStats {
	v := a.views()
	out := make([]ExchangeStats, len(v.Peers))
	var wg sync.WaitGroup
	a.mu.Lock()
	for i := range v.Peers {
		if v.Peers[i] == nil {
			continue
		}
		if a.state[i].Running {
			out[i] = ExchangeStats{Peer: v.URL(i), Err: "an exchange with this peer is already running"}
			continue
		}
		a.state[i].Running, a.state[i].Progress = true, 0
		wg.Add(1)
		started := a.work.Go(func(ctx context.Context) {
			defer wg.Done()
			select {
			case a.sem <- struct{}{}:
			case <-ctx.Done():
				a.mu.Lock()
				a.state[i].Running = false
				a.mu.Unlock()
				out[i] = ExchangeStats{Peer: v.URL(i), Err: "node stopping"}
				return
			}
			defer func() { <-a.sem }()
			out[i] = a.runExchange(i)
		})
		if !started { // the service is closed
			a.state[i].Running = false
			out[i] = ExchangeStats{Peer: v.URL(i), Err: "node stopping"}
			wg.Done()
		}
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
		if v.Peers[i] != nil {
			res = append(res, st)
		}
	}
	return res
}

// Status returns anti-entropy's state with every peer.
func (a *Service) Status() []PeerSync {
	v := a.views()
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []PeerSync
	for _, i := range v.Others() {
		out = append(out, a.state[i])
	}
	return out
}

// SyncedSince returns, per node, when the last exchange with it that left
// nothing differing started, and with which of its incarnations
// (view.Synced; zero: none since this node started; zero for this node
// too).
func (a *Service) SyncedSince() []view.Synced {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]view.Synced, len(a.state))
	for i, s := range a.state {
		out[i] = view.Synced{At: s.LastSuccess, Incarnation: s.Incarnation}
	}
	return out
}

// Warnings names the peers with which no exchange succeeded for two
// intervals (since this node started, or since the last success): the
// schedule is not keeping the replicas in step.
func (a *Service) Warnings(now time.Time) []string {
	if a.o.Interval <= 0 {
		return nil
	}
	v := a.views()
	a.mu.Lock()
	defer a.mu.Unlock()
	var ws []string
	for _, i := range v.Others() {
		s := a.state[i]
		since := a.started
		if v.Since.After(since) {
			since = v.Since
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

func (a *Service) setProgress(i int, f float64) {
	a.mu.Lock()
	a.state[i].Progress = f
	peer := a.state[i].Peer // Members rewrites it under a.mu
	a.mu.Unlock()
	a.m.progress.WithLabelValues(peer).Set(f)
}
