// Package settle compacts a store that stopped taking writes into its
// read-optimal shape: every table in the bottom level.
//
// Pebble compacts by the levels' sizes and L0's file count, which a store
// that takes no writes never changes: L0 keeps up to
// --l0-compaction-threshold flushes and the levels above the bottom keep
// what they hold, for ever. Each of them costs a GET that misses the read
// cache: a bloom filter per L0 file, and, for a key above the bottom
// level, the lookup's walk on down for older merge operands (see
// store.Shape). A node that was filled or joined, then mostly read, pays
// that on every miss (docs/benchmarks.md section 38).
//
// The Settler watches the store and compacts it into the bottom level
// once the store is quiet and the compaction is worth its cost:
//
//   - quiet: not one byte written to the WAL for Options.After. Why not a
//     lower rate: Pebble's manual compaction of a range first flushes a
//     memtable that holds keys of it, and a flushed write spans the key
//     space (keys are hashed into partitions), so the next slice's L0
//     step would rewrite every table of the level below with it: a
//     trickle of writes would rewrite that level once per slice.
//   - worth it: at least a quarter of the tables' bytes in L0 or above the
//     bottom level, and at least minAbove. The slices rewrite the bottom
//     level once, at most three bytes for each byte above it; the data
//     above is rewritten once per level on its way down. Pebble's steady
//     state for a large store (each level a tenth of the next) is not
//     touched; a small one, whose base level is the bottom, is, after a
//     burst of writes: cheap at its size.
//
// It compacts the key space slice by slice (store.Slices, about
// Options.SliceBytes of the bottom level each; the first also takes L0
// and the levels above whole, their tables spanning the key space),
// paced by Options.Rate, which the node's background pace lowers while
// requests wait for the CPU. It stops between slices at the first byte
// written since it began (the writes are back; Pebble shapes the store
// again), once the store refuses writes (failed, or its volume below
// --min-free-space: a slice needs room for its new tables before it frees
// the old ones; no settle begins then either), or on Close; the slice
// under way completes (Pebble runs one compaction at a time, its own
// picked first). Each stop doubles the quiet period the next settle
// waits for, up to maxBackoff times After, so that a store written now
// and then does not pay a first slice every After; a settle that is done
// resets it. The quarter rule keeps a settled store from being compacted
// again until writes moved a quarter of it above the bottom.
package settle

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures a Settler. Zero fields take the defaults noted.
type Options struct {
	// After is how long the store must take no write before it is
	// settled (--settle-after; DefaultOptions: 2 min; 0 never, and
	// EnsureDefaults leaves it so).
	After time.Duration
	// Rate is the most bytes of the bottom level a second the settle
	// compacts (--settle-rate; default 32 MiB), lowered to an eighth by
	// the background pace while requests wait for the CPU. A store of
	// 100 GiB settles in about an hour at the default.
	Rate int64
	// SliceBytes is about how much of the bottom level one compaction
	// rewrites (no flag; default 64 MiB): the most a settle does after it
	// was asked to stop, but in its first slice, which also takes L0 and
	// the levels above whole.
	SliceBytes uint64
	// Interval is how often the store's shape is read (no flag; default
	// 10 s, and at most After).
	Interval time.Duration
}

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	return Options{After: 2 * time.Minute, Rate: 32 << 20, SliceBytes: 64 << 20, Interval: 10 * time.Second}
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.After, "settle-after", o.After, "compact the store into its bottom level once it took no write for this long and a quarter of it lies above that level: cheaper GETs that miss the read cache (0: never)")
	sizeflag.Var(fs, &o.Rate, "settle-rate", "most bytes of the bottom level a second a settle compacts, a `size` (0: the default); slowed down to an eighth while requests wait for the CPU")
}

// Validate refuses what the loop cannot run with.
func (o *Options) Validate() error {
	switch {
	case o.After < 0:
		return fmt.Errorf("--settle-after %v: must not be negative (0 turns settling off)", o.After)
	case o.Rate < 0:
		return fmt.Errorf("--settle-rate %d: must not be negative", o.Rate)
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	d := DefaultOptions()
	if o.Rate <= 0 {
		o.Rate = d.Rate
	}
	if o.SliceBytes == 0 {
		o.SliceBytes = d.SliceBytes
	}
	if o.Interval <= 0 {
		o.Interval = d.Interval
	}
	if o.After > 0 {
		o.Interval = min(o.Interval, o.After)
	}
}

// minAbove is the least data above the bottom level worth a settle: below
// it, the lookups it would save are few and the log line is noise.
const minAbove = 1 << 20

// maxBackoff bounds the quiet period after stopped settles: After times
// this.
const maxBackoff = 32

// Store is what a Settler reads and compacts (*store.Store).
type Store interface {
	// Writable is nil while the store takes writes: not failed, its
	// volume above --min-free-space.
	Writable() error
	Shape() store.Shape
	Slices(maxBytes uint64) ([]store.KeyRange, error)
	CompactRange(ctx context.Context, r store.KeyRange) error
}

// Settler runs the settles of one store. Its methods are safe for
// concurrent use; the loop's state is its goroutine's.
type Settler struct {
	st    Store
	o     Options
	log   *slog.Logger
	limit *rate.Limiter
	work  *worker.Group
	now   func() time.Time
	m     *metrics

	// The loop's goroutine only: the WAL's byte count last seen, when it
	// was first seen, and the quiet period the next settle waits for.
	wal        uint64
	quietSince time.Time
	wait       time.Duration
}

// New returns the settler of st. Start starts its loop.
func New(st Store, o Options, log *slog.Logger) *Settler {
	o.EnsureDefaults()
	return &Settler{
		st: st, o: o, log: log, work: worker.New(), now: time.Now, m: newMetrics(),
		limit: rate.NewLimiter(rate.Limit(o.Rate), int(min(o.Rate, int64(o.SliceBytes)))),
		wait:  o.After,
	}
}

// Limiter is the settles' rate limiter (Rate), for the node's background
// pace to govern.
func (t *Settler) Limiter() *rate.Limiter { return t.limit }

// Register adds the instruments to reg.
func (t *Settler) Register(reg prometheus.Registerer) { t.m.register(reg) }

// Start reads the store's shape every Interval and settles it when due;
// Close stops it. With After 0 it starts nothing.
func (t *Settler) Start() {
	if t.o.After <= 0 {
		return
	}
	t.work.Tick(t.o.Interval, func(ctx context.Context) { t.check(ctx, t.st.Shape()) })
}

// Close stops the loop; a settle under way stops once its slice is done.
func (t *Settler) Close() { t.work.Stop() }

// check settles the store if sh says it is due (see due).
func (t *Settler) check(ctx context.Context, sh store.Shape) {
	now := t.now()
	if t.quietSince.IsZero() || sh.WALBytes != t.wal {
		t.wal, t.quietSince = sh.WALBytes, now
		return
	}
	if !due(now.Sub(t.quietSince), t.wait, sh) || t.st.Writable() != nil {
		return
	}
	if t.settle(ctx, sh) {
		t.wait = t.o.After
	} else {
		t.wait = min(2*t.wait, maxBackoff*t.o.After)
	}
	t.wal, t.quietSince = t.st.Shape().WALBytes, t.now()
}

// due reports whether a store quiet for quiet, of shape sh, is to be
// settled now (the package's rules).
func due(quiet, after time.Duration, sh store.Shape) bool {
	return after > 0 && quiet >= after && sh.Above >= minAbove && sh.Above*4 >= sh.Total
}

// errWritesBack stops a settle once the store took a write since it
// began.
var errWritesBack = errors.New("writes are back")

// settle compacts the store slice by slice, at Rate, and reports whether
// it did every slice.
func (t *Settler) settle(ctx context.Context, before store.Shape) bool {
	began := t.now()
	slices, err := t.st.Slices(t.o.SliceBytes)
	if err != nil {
		t.log.Warn("settle: cannot list the store's tables", "err", err)
		return false
	}
	t.log.Info("settle: compacting the store into its bottom level", "above_bytes", before.Above, "total_bytes", before.Total,
		"slices", len(slices), "quiet_for", t.wait)
	var done uint64
	for _, r := range slices {
		if err = pace.WaitBytes(ctx, t.limit, int(r.Bytes)); err != nil {
			break
		}
		if t.st.Shape().WALBytes != before.WALBytes {
			err = errWritesBack
			break
		}
		if err = t.st.Writable(); err != nil {
			break
		}
		if err = t.st.CompactRange(ctx, r); err != nil {
			break
		}
		done += r.Bytes
		t.m.bytes.Add(float64(r.Bytes))
	}
	switch {
	case err == nil:
		after := t.st.Shape()
		t.m.settles.WithLabelValues("done").Inc()
		t.log.Info("settle: done", "took", t.now().Sub(began).Round(time.Millisecond), "compacted_bytes", done,
			"above_bytes", after.Above, "total_bytes", after.Total)
	case ctx.Err() != nil:
		t.m.settles.WithLabelValues("stopped").Inc()
	default:
		t.m.settles.WithLabelValues("stopped").Inc()
		t.log.Info("settle: stopped", "why", err, "took", t.now().Sub(began).Round(time.Millisecond), "compacted_bytes", done,
			"next_quiet_for", min(2*t.wait, maxBackoff*t.o.After))
	}
	return err == nil
}

type metrics struct {
	settles *prometheus.CounterVec
	bytes   prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_settles_total",
			Help: "Settles of the store into its bottom level, by result: done, or stopped (writes came back, or the node stopped).",
		}, []string{"result"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_settle_compacted_bytes_total",
			Help: "Bytes of the bottom level that settles compacted (--settle-rate paces them).",
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) { reg.MustRegister(m.settles, m.bytes) }
