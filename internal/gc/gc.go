// Package gc removes the tombstones and expired values every replica of
// their partition has (tombstone garbage collection).
//
// A tombstone (or a value past its expiry) may be removed from this node
// once two things hold:
//
//  1. every other replica of its partition has it: since it arrived here,
//     this node started an anti-entropy exchange with each of them that
//     left nothing differing. Such an exchange pushed it, or found the
//     peer holding it or something newer. Arrival is in the record's index
//     entry; exchanges' start times are in memory only, so after a restart
//     nothing is removed before a new exchange with every peer. What an
//     exchange found holds only while the peer's process runs: restarted,
//     it may hold older data (a backup restored, even within Grace). So
//     an exchange counts only while the peer still answers a ping with
//     the incarnation it had before and after the exchange
//     (view.Synced), asked at the start of a pass and again before each
//     removal that follows the last question by more than reconfirm. A
//     replica that is down, cut off or restarted since therefore stops
//     collection of every partition it shares until the next exchange
//     with it: it can never come back to find a delete forgotten. (A
//     restore done whole, the process stopped, its directory replaced
//     and started again, between the last question and a removal, within
//     reconfirm, would not be seen.)
//  2. its delete (the tombstone's version time, or the expiry) is older
//     than Grace. Removing raises the horizon of the record's partition to
//     that cut-off, or to the start of the oldest exchange relied on less
//     Lag where that is lower (a horizon claims what the exchanges saw:
//     Pass), and from then on the replica drops every write older
//     than it of a key of that partition that holds nothing (answering as
//     if it held something newer): a write older than a removed delete,
//     delivered late, cannot resurrect the key (store's gc.go says why a
//     horizon is a partition's and spares keys that hold an older record).
//     Grace exceeds the hint window and the clock skew bound, so no hint
//     the cluster still holds is ever refused.
//
// Another replica still holding a tombstone this node removed offers it in
// the next exchange; this node drops it (below its horizon) and counts it
// as done, and that replica removes its own copy once its own rule holds.
//
// A pass reads the whole index and runs beside requests, so it is paced
// (Options.Rate, governed by the node's background pace like the other
// mechanisms): it takes tokens for the index entries of a partition after
// reading them, and for a batch of candidates, removeCost each, before
// removing it.
package gc

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures garbage collection. Zero fields take the defaults
// noted (EnsureDefaults).
type Options struct {
	// Grace is how long a tombstone or an expired value is kept at least,
	// from its delete or expiry (--gc-grace; default 4 h; the node passes
	// the hint window plus the clock skew bound plus an hour, and checks
	// that a value it is given exceeds the first two).
	Grace time.Duration
	// Interval is how often the collector checks whether a pass is due
	// (default 1 min; see Collector.due).
	Interval time.Duration
	// Rate is the most index entries a second a pass reads, a record it
	// removes counting as removeCost entries (--gc-rate; default
	// DefaultRate). A pass over N records takes at least N/Rate seconds.
	Rate int
	// Lag is how far below the moment it reaches a replica a write's
	// version may be: its coordinator's clock behind, and the write in
	// flight (no flag; the node passes --max-clock-skew plus
	// --replica-timeout plus a second; default 0). A pass raises a
	// partition's horizon no higher than its relied-on exchanges' start
	// less Lag (Pass).
	Lag time.Duration
}

// DefaultRate is Options.Rate's default: reading an index entry costs
// about 0.5 µs of CPU (BenchmarkCandidates), so a pass at this rate takes
// about a tenth of a core, and reads 100M records (100 GiB of 1 KiB
// values) in about 8 minutes; the background pace lowers it to an eighth
// while requests wait for the CPU.
const DefaultRate = 200_000

// removeCost is what removing a record costs in index entries read: its
// version read again, its record and index entry deleted in a synced
// commit, and the compaction of the deletions (about 6 µs a record in
// batches of gcBatch, BenchmarkCollectWriteStall, against 0.5 µs an entry
// read).
const removeCost = 12

// DefaultOptions returns the defaults the fields document, with Grace 0:
// the node derives it from the hint window and the clock skew bound.
func DefaultOptions() Options { return Options{Interval: time.Minute, Rate: DefaultRate} }

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Grace, "gc-grace", o.Grace, "keep tombstones and expired values at least this long after the delete or expiry; then remove them once every replica has them (must exceed --hint-window + --max-clock-skew; 0: their sum + 1h)")
	fs.IntVar(&o.Rate, "gc-rate", o.Rate, "most index entries a second a garbage-collection pass reads (a record removed counts as 12); slowed down to an eighth while requests wait for the CPU (--background-sched-latency)")
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Grace <= 0 {
		o.Grace = 4 * time.Hour
	}
	if o.Interval <= 0 {
		o.Interval = time.Minute
	}
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
}

// gcBatch bounds the records removed in one store commit.
const gcBatch = 1024

// Collector runs the passes. Its methods are safe for concurrent use.
type Collector struct {
	local      *replica.Replica
	views      func() *view.View
	synced     func() []view.Synced
	rebuilding func() bool
	o          Options
	log        *slog.Logger
	m          *metrics
	limit      *rate.Limiter // Rate
	work       *worker.Group
	now        func() time.Time

	// The last pass (the loop's goroutine only): when, and what the
	// exchanges' start times were then.
	lastPass   time.Time
	lastSynced []view.Synced
}

// New returns the collector of local's records, routed by the views views
// returns. synced returns, per node, when the last anti-entropy exchange
// with it that left nothing differing started, with the peer's
// incarnation then (antientropy.Service.SyncedSince); while rebuilding
// reports true (nil: never), nothing is removed. Start starts the passes.
func New(local *replica.Replica, views func() *view.View, synced func() []view.Synced, rebuilding func() bool, o Options, log *slog.Logger) *Collector {
	o.EnsureDefaults()
	if rebuilding == nil {
		rebuilding = func() bool { return false }
	}
	return &Collector{
		local: local, views: views, synced: synced, rebuilding: rebuilding, o: o, log: log,
		m: newMetrics(), limit: rate.NewLimiter(rate.Limit(o.Rate), max(o.Rate/10, gcBatch*removeCost)),
		work: worker.New(), now: time.Now,
	}
}

// Limiter is the passes' rate limiter (Rate), for the node's background
// pace to govern.
func (g *Collector) Limiter() *rate.Limiter { return g.limit }

// Register adds the instruments to reg.
func (g *Collector) Register(reg prometheus.Registerer) { g.m.register(reg) }

// due reports whether a pass may find something the last did not: an
// exchange completed since (rule 1 may newly hold), or Grace passed (rule
// 2 may newly hold for records that were too young). A pass reads the
// whole index, so between exchanges it runs at most once a Grace; a
// record whose grace ends between exchanges waits for the next exchange
// or that long.
func (g *Collector) due(now time.Time, synced []view.Synced) bool {
	if now.Sub(g.lastPass) >= g.o.Grace || !slices.EqualFunc(synced, g.lastSynced, view.Synced.Equal) {
		g.lastPass, g.lastSynced = now, synced
		return true
	}
	return false
}

// Start runs a pass whenever one is due (see due), checking every
// Interval; Close stops it.
func (g *Collector) Start() {
	g.work.Tick(g.o.Interval, func(ctx context.Context) {
		if g.due(g.now(), g.synced()) {
			g.Pass(ctx)
		}
	})
}

// Close stops the passes; one under way stops at its next commit.
func (g *Collector) Close() { g.work.Stop() }

// Pass removes what the rules above allow, partition by partition, now,
// at Rate, and returns how many records it removed. It stops early, with
// what it removed so far, once ctx is done or the collector is closing.
func (g *Collector) Pass(ctx context.Context) int {
	if g.rebuilding() {
		return 0
	}
	now := g.now()
	cutoff := now.Add(-g.o.Grace)
	horizon := hlc.VersionAt(cutoff)
	synced := g.synced()
	removed := 0
	v := g.views()
	if v.Moving {
		return 0 // see the rule above: not while partitions move
	}
	confirmed := time.Now() // before the pings: an answer is at most this old
	running := incarnations(v)
	g.logRestarted(v, synced, running)
	// The peers whose exchanges the pass may rely on: they answer with
	// the incarnation they had then.
	relied := make([]bool, len(running))
	for i, inc := range running {
		relied[i] = inc != 0 && inc == synced[i].Incarnation
	}
	var buf [8]int
	var cands []store.Candidate
	for p := range partition.Count {
		if ctx.Err() != nil || g.work.Stopping() {
			break
		}
		part := partition.ID(p)
		reps := v.OldReplicas(part, buf[:0])
		arrivedBefore, mine := now, false
		for _, r := range reps {
			if r == v.Self {
				mine = true
				continue
			}
			switch s := synced[r]; {
			case !relied[r]:
				arrivedBefore = time.Time{} // restarted, or silent: stops the partition
			case s.At.Before(v.Since):
				arrivedBefore = time.Time{} // not since this map: stops the partition
			case s.At.Before(arrivedBefore):
				arrivedBefore = s.At // zero (never) stops the partition
			}
		}
		if !mine || arrivedBefore.IsZero() {
			continue
		}
		// The partition's horizon claims that every write below it that
		// this node lacks was overtaken by a delete removed here: true
		// only of what the exchanges relied on had seen (arrivedBefore,
		// which may be older than the cutoff when a peer's exchanges
		// keep failing, or --gc-grace is under --ae-interval), less
		// Lag, for a write that reached the peer after its exchange with
		// a version from before it. Above that, a write this node missed
		// is one the next exchange must still bring, not refuse.
		partHorizon := min(horizon, hlc.VersionAt(arrivedBefore.Add(-g.o.Lag)))
		cands = cands[:0]
		read, err := g.local.Store.Candidates(part, uint64(cutoff.UnixMilli()), uint64(arrivedBefore.UnixMilli()), func(key []byte, e store.IndexEntry) error {
			if e.Version >= partHorizon {
				return nil // above what the exchanges vouch for: a later pass
			}
			cands = append(cands, store.Candidate{Key: bytes.Clone(key), Version: e.Version})
			return nil
		})
		g.m.read.Add(float64(read))
		if err != nil {
			g.log.Error("garbage collection", "partition", p, "err", err)
			continue
		}
		if pace.WaitBytes(ctx, g.limit, read) != nil {
			break
		}
		for len(cands) > 0 && !g.work.Stopping() {
			chunk := cands[:min(len(cands), gcBatch)]
			cands = cands[len(chunk):]
			if pace.WaitBytes(ctx, g.limit, len(chunk)*removeCost) != nil {
				break
			}
			if g.views() != v {
				return g.stoppedAtNewMap(removed)
			}
			if time.Since(confirmed) > reconfirm {
				confirmed = time.Now()
				if now := incarnations(v); !stillRunning(relied, running, now) {
					g.log.Info("garbage collection stopped: a peer it relied on restarted or stopped answering during the pass; the next pass follows its next exchange", "removed", removed)
					return removed
				}
			}
			// Checked again under the store's lock, as the removal
			// commits: an install that happens after this check waits
			// (store.AwaitCommits, package membership) until the
			// commit is done, and one before it withdraws the commit.
			n, err := g.local.Collect(chunk, partHorizon, func() bool { return g.views() == v })
			if errors.Is(err, store.ErrCollectWithdrawn) {
				return g.stoppedAtNewMap(removed)
			}
			if err != nil {
				g.log.Error("garbage collection", "partition", p, "err", err)
				break
			}
			removed += n
			g.m.horizon.Set(float64(hlc.TimeOf(g.local.Store.HighestHorizon()).UnixMilli()) / 1e3)
			g.m.removed.Add(float64(n))
		}
	}
	if removed > 0 {
		g.log.Info("garbage collection", "removed", removed, "horizon", cutoff.UTC().Format(time.RFC3339))
	}
	return removed
}

// stoppedAtNewMap ends a pass during which a new cluster map was
// installed: a change may be under way (rule 1: nothing is removed while
// partitions move), and the exchanges relied on vouched for the old
// map's replica sets.
func (g *Collector) stoppedAtNewMap(removed int) int {
	g.log.Info("garbage collection stopped: a new cluster map was installed during the pass; the next pass follows its exchanges", "removed", removed)
	return removed
}

// reconfirm is how old the peers' last answers (incarnations) may be when
// a pass removes records on the strength of their exchanges: a second,
// against passes that take minutes on a large store.
const reconfirm = time.Second

// incarnations pings every peer of v at once and returns, per node, the
// incarnation that answered (0: none answered, or one that does not say;
// 0 for this node).
func incarnations(v *view.View) []uint64 {
	out := make([]uint64, len(v.Peers))
	others := v.Others()
	for k, r := range v.PingAll(others, pingTimeout) {
		if r.Err == nil {
			out[others[k]] = r.Answer.Incarnation
		}
	}
	return out
}

// stillRunning reports whether every peer relied on answered with the
// incarnation it ran before; the others do not matter to the pass.
func stillRunning(relied []bool, before, now []uint64) bool {
	for i, r := range relied {
		if r && now[i] != before[i] {
			return false
		}
	}
	return true
}

// pingTimeout bounds incarnations' pings (the peer's own timeout, the
// node's --replica-timeout, bounds them further).
const pingTimeout = 5 * time.Second

// logRestarted says which peers a pass does not trust the last exchange
// with because they run another incarnation now.
func (g *Collector) logRestarted(v *view.View, synced []view.Synced, running []uint64) {
	for _, i := range v.Others() {
		if s := synced[i].Incarnation; s != 0 && running[i] != 0 && s != running[i] {
			g.log.Info("garbage collection: a peer restarted since the last exchange with it; what it shares waits for the next", "peer", v.URL(i))
		}
	}
}
