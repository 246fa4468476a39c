// Package pace slows a node's background work down while its requests
// wait for the CPU, and lets it go at its full rates while they do not.
//
// Anti-entropy, hint replay, partition copies, drops and garbage
// collection each have a rate limit in bytes, records or index entries a
// second (--ae-rate, --ae-summary-rate, --hint-replay-rate, --move-rate,
// --drop-rate, --gc-rate). A fixed rate cannot be right on every
// machine: on two cores the defaults let anti-entropy take as much CPU as
// the foreground writes (docs/benchmarks.md sections 23 and 25), on
// sixteen they are a small share. The Governor measures what the
// foreground feels, the Go scheduler's latency (how long runnable
// goroutines waited for a P, runtime/metrics /sched/latencies:seconds),
// and scales every governed limiter's rate by one factor:
//
//   - every Interval, the p99 of the latencies recorded in that interval;
//   - above Target, the factor halves, down to Floor;
//   - below Target/2, it grows by a quarter, up to 1 (the configured
//     rates); between the two it grows by a twentieth (Creep).
//
// A second signal, the share of the interval the process's cgroup had a
// task waiting for a CPU (Linux PSI, pressure.go), halves it the same way
// above CPUPressure and slows its growth to Creep above half of that: the
// scheduler's latency does not see the kernel's CPUs taken by other
// processes or by more Ps than cores.
//
// Why creep rather than hold between the bounds: a node under steady
// load sits there (a CPU pressure of 0.1-0.2 on two cores with eight Ps),
// and a factor that held there kept whatever the last burst had halved it
// to, for as long as the load lasted: a ratchet down to the floor, with
// both signals saying there was room (docs/benchmarks.md section 43). At
// a twentieth an interval the factor climbs from the floor back to 1 in
// about 11 s unless a burst halves it again.
//
// This is CockroachDB's elastic CPU limiter's rule (its admission control
// holds the scheduler's p99 near 1 ms by adjusting the CPU share of
// backups and other elastic work), applied to rates rather than CPU
// tokens: background work here is a stream of records whose CPU cost per
// byte is about constant, so its rate is its CPU share. Halving reacts
// within a few intervals to a burst of requests; growing by a quarter
// takes about 2 s from the floor back to the full rates. The floor keeps
// every mechanism moving (hints still reach their targets, changes still
// end) at an eighth of its rate on a saturated node.
package pace

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"math"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures a Governor.
type Options struct {
	// Target is the scheduler latency, p99 over an Interval, above which
	// background work is slowed (--background-sched-latency; default
	// 1ms; 0 turns the governor off: the configured rates always).
	Target time.Duration
	// CPUPressure is the share of an Interval during which some task of
	// the process's cgroup waited for a CPU (Linux PSI, pressure.go)
	// above which background work is slowed as well
	// (--background-cpu-pressure; default DefaultCPUPressure; 0: the
	// scheduler's latency alone). Where the kernel has no PSI it is not
	// used.
	CPUPressure float64
}

// DefaultCPUPressure is Options.CPUPressure's default.
const DefaultCPUPressure = 0.2

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	return Options{Target: time.Millisecond, CPUPressure: DefaultCPUPressure}
}

// RegisterFlags defines the flags of the fields, with their current values
// as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.Float64Var(&o.CPUPressure, "background-cpu-pressure", o.CPUPressure, "also slow them while tasks of this process's cgroup wait for a CPU more than this share of the time (Linux pressure stall information); 0: the scheduler's latency alone")
	fs.DurationVar(&o.Target, "background-sched-latency", o.Target, "slow anti-entropy, hint replay, partition copies, drops, garbage collection and settles (down to an eighth of their rates) while the Go scheduler's p99 latency is above this; 0: always their full rates")
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.Target < 0 {
		return errors.New("--background-sched-latency must not be negative")
	}
	if o.CPUPressure < 0 || o.CPUPressure >= 1 {
		return errors.New("--background-cpu-pressure must be in [0, 1)")
	}
	return nil
}

const (
	// Interval is how often the factor is set.
	Interval = 250 * time.Millisecond
	// Floor is the least factor.
	Floor = 1.0 / 8
	// Creep is the factor's growth in an interval whose signals are
	// between half their bounds and their bounds.
	Creep = 1.05
	// minSamples is the fewest scheduler latencies an interval needs for
	// its p99 to count; fewer means an idle process, and the factor grows.
	minSamples = 64
)

// Governor scales the rates of the limiters it governs (see the package
// comment). New starts nothing; Start runs it, Close stops it. Its methods
// are safe for concurrent use.
type Governor struct {
	o    Options
	log  *slog.Logger
	work *worker.Group

	mu       sync.Mutex
	governed []governed
	factor   float64
	// prev is the scheduler latency histogram at the last interval's end.
	prev []uint64
	// pressure reads the CPU pressure (nil: not used).
	pressure *pressureReader

	m *instruments
}

type governed struct {
	l    *rate.Limiter
	full rate.Limit
}

// New returns a governor with nothing to govern yet.
func New(o Options, log *slog.Logger) *Governor {
	g := &Governor{o: o, log: log, work: worker.New(), factor: 1, m: newInstruments()}
	g.m.factor.Set(1)
	return g
}

// Govern puts l under g: its current limit is its full rate, and from now
// on g sets it to that times the factor.
func (g *Governor) Govern(l *rate.Limiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	full := l.Limit()
	g.governed = append(g.governed, governed{l: l, full: full})
	l.SetLimit(full * rate.Limit(g.factor))
}

// Factor is the share of their full rates the governed limiters run at.
func (g *Governor) Factor() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.factor
}

// Start runs the governor every Interval, unless Target is 0.
func (g *Governor) Start() {
	if g.o.Target <= 0 {
		return
	}
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		g.log.Warn("background pace: the runtime reports no scheduler latencies; rates stay as configured")
		return
	}
	var pr *pressureReader
	if g.o.CPUPressure > 0 {
		var ok bool
		switch pr, ok = newPressureReader(); {
		case !ok:
			g.log.Info("background pace: the kernel reports no CPU pressure; the scheduler's latency alone sets the pace")
		case pr.machine():
			// the root cgroup, or none found: every process's waits count
			g.log.Info("background pace: the CPU pressure read is the whole machine's", "file", pr.path)
		default:
			g.log.Info("background pace: the CPU pressure read is this process's cgroup's", "file", pr.path)
		}
	}
	g.mu.Lock() // the latencies before now are not the first interval's
	g.prev = append([]uint64(nil), sample[0].Value.Float64Histogram().Counts...)
	g.pressure = pr
	g.mu.Unlock()
	g.work.Tick(Interval, func(context.Context) {
		metrics.Read(sample)
		share := -1.0
		if pr != nil {
			share = pr.share(time.Now())
		}
		g.Observe(sample[0].Value.Float64Histogram(), share)
	})
}

// WaitBytes waits until l allows n more bytes, in steps of at most its
// burst (rate.Limiter refuses a wait beyond it): the wait for one large
// record. Its error is WaitN's: ctx ended, or would before the wait.
func WaitBytes(ctx context.Context, l *rate.Limiter, n int) error {
	for n > 0 {
		step := min(n, l.Burst())
		if step <= 0 { // no burst: WaitN's answer for the whole (nil at rate.Inf, else its error)
			return l.WaitN(ctx, n)
		}
		if err := l.WaitN(ctx, step); err != nil {
			return err
		}
		n -= step
	}
	return nil
}

// Close stops the governor; the limiters keep their last rates.
func (g *Governor) Close() { g.work.Stop() }

// Observe sets the factor from h, the scheduler latency histogram since
// the process started (cumulative, as runtime/metrics reports it): the
// latencies recorded since the last Observe are the interval's; and from
// pressure, the interval's CPU pressure share (-1: none).
func (g *Governor) Observe(h *metrics.Float64Histogram, pressure float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.prev) != len(h.Counts) {
		g.prev = make([]uint64, len(h.Counts))
	}
	var n uint64
	for i, c := range h.Counts {
		n += c - g.prev[i]
	}
	p99 := time.Duration(-1) // too few samples: idle
	if n >= minSamples {
		rank := n - n/100 // the first latency at or above the p99
		var seen uint64
		for i, c := range h.Counts {
			if seen += c - g.prev[i]; seen >= rank {
				upper := h.Buckets[i+1] // the bucket's upper bound, or its lower one for the last
				if math.IsInf(upper, 1) {
					upper = h.Buckets[i]
				}
				p99 = time.Duration(upper * float64(time.Second))
				break
			}
		}
	}
	copy(g.prev, h.Counts)
	g.setFactor(next(g.factor, p99, g.o.Target, pressure, g.o.CPUPressure))
	if p99 < 0 {
		g.m.p99.Set(-1)
	} else {
		g.m.p99.Set(p99.Seconds())
	}
	g.m.pressure.Set(pressure)
}

// next is the factor after an interval whose scheduler p99 was p99 (-1:
// too few samples) with target, and whose CPU pressure share was pressure
// (-1: not known) with its bound maxPressure (0: not used).
func next(factor float64, p99, target time.Duration, pressure, maxPressure float64) float64 {
	if maxPressure <= 0 {
		pressure = -1
	}
	switch {
	case p99 > target || pressure > maxPressure:
		return max(Floor, factor/2)
	case p99 < target/2 && pressure < maxPressure/2:
		return min(1, factor*1.25)
	}
	return min(1, factor*Creep)
}

// setFactor sets the factor and every governed limiter's rate; g.mu held.
func (g *Governor) setFactor(f float64) {
	if f != g.factor {
		if f < g.factor {
			g.m.slowed.Inc()
		}
		g.factor = f
		for _, x := range g.governed {
			x.l.SetLimit(x.full * rate.Limit(f))
		}
	}
	g.m.factor.Set(f)
}

// Register registers g's instruments with reg.
func (g *Governor) Register(reg prometheus.Registerer) {
	reg.MustRegister(g.m.factor, g.m.p99, g.m.pressure, g.m.slowed)
}

type instruments struct {
	factor   prometheus.Gauge
	p99      prometheus.Gauge
	pressure prometheus.Gauge
	slowed   prometheus.Counter
}

func newInstruments() *instruments {
	return &instruments{
		factor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_background_pace_factor",
			Help: "Share of their configured rates that anti-entropy, hint replay, partition copies, drops and garbage collection run at (1: full; --background-sched-latency, --background-cpu-pressure).",
		}),
		p99: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_background_pace_sched_latency_p99_seconds",
			Help: "The Go scheduler's p99 latency over the background pace's last interval (-1: too few samples, idle).",
		}),
		pressure: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_background_pace_cpu_pressure_ratio",
			Help: "Share of the background pace's last interval during which some task of the process's cgroup waited for a CPU (Linux PSI; -1: not read).",
		}),
		slowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_background_pace_slowdowns_total",
			Help: "Times the background pace lowered the rates because the scheduler's p99 latency was above --background-sched-latency or the CPU pressure above --background-cpu-pressure.",
		}),
	}
}
