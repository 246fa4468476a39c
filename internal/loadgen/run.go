package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// plan is the timing of one run, shared read-only by its workers plus the
// two counters they advance.
type plan struct {
	start        time.Time // first request (rate mode: slot 0's intended time)
	measureStart time.Time // end of warm-up
	windowEnd    time.Time // end of the measured window: nothing new is scheduled after it
	drainEnd     time.Time // rate mode: late slots are not sent after this
	interval     float64   // rate mode: nanoseconds between slots
	maxRequests  int64     // 0 = unbounded
	done         <-chan struct{}

	next    atomic.Int64 // next slot (rate) or number of requests issued (closed)
	stopped atomic.Bool  // set when maxRequests stopped the run
}

// slotOffset is the intended send time of slot i relative to start. It is
// computed from i, not accumulated, so the schedule never drifts.
func (p *plan) slotOffset(i int64) time.Duration {
	return time.Duration(float64(i) * p.interval)
}

// slotsBefore is the number of slots whose intended time is before start+d.
func (p *plan) slotsBefore(d time.Duration) int64 {
	n := int64(float64(d) / p.interval)
	for n > 0 && p.slotOffset(n-1) >= d {
		n--
	}
	for p.slotOffset(n) < d {
		n++
	}
	return n
}

// Run performs one run described by cfg: warm-up, then the measured window,
// then (constant rate only) the drain of late requests. It returns the merged
// result; transport errors are part of the result, not of err.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	workers, err := newWorkers(&cfg, seedOf(&cfg))
	if err != nil {
		return nil, fmt.Errorf("set up workers: %w", err)
	}
	defer func() {
		for _, w := range workers {
			w.release()
		}
	}()

	p := &plan{maxRequests: cfg.MaxRequests, done: ctx.Done()}
	if cfg.Rate > 0 {
		p.interval = 1e9 / cfg.Rate
	}
	p.start = time.Now()
	p.measureStart = p.start.Add(cfg.Warmup)
	p.windowEnd = p.measureStart.Add(cfg.Duration)
	p.drainEnd = p.windowEnd.Add(cfg.Drain)
	for _, w := range workers {
		if cfg.Timeline {
			w.rec.keepTimeline(p.measureStart)
		}
		if cfg.Mark != nil {
			w.rec.keepMarked(cfg.Mark)
		}
		if cfg.Workload == WorkloadMixed {
			w.rec.keepByOp()
		}
	}

	// Cancellation must also wake workers asleep until a far-off slot.
	// Its time is when the run gave up the slots not sent.
	var interrupted atomic.Pointer[time.Time]
	stopInterrupt := context.AfterFunc(ctx, func() {
		now := time.Now()
		interrupted.Store(&now)
		for _, w := range workers {
			w.sleep.interrupt()
		}
	})
	defer stopInterrupt()

	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			if cfg.Rate > 0 {
				w.runRate(p)
			} else {
				w.runClosed(p)
			}
		})
	}
	wg.Wait()
	end := time.Now()
	gaveUp := end // when the unsent slots were given up
	if p.drainEnd.Before(gaveUp) {
		gaveUp = p.drainEnd
	}
	if t := interrupted.Load(); t != nil && t.Before(gaveUp) {
		gaveUp = *t
	}

	total := newRecorder()
	for _, w := range workers {
		total.merge(w.rec)
	}

	// A constant-rate run that ran out of slots has lasted the whole window
	// even if its last answers came early; one stopped by max-requests or
	// cancellation lasted until it stopped.
	if cfg.Rate > 0 && !p.stopped.Load() && ctx.Err() == nil && end.Before(p.windowEnd) {
		end = p.windowEnd
	}
	elapsed := max(end.Sub(p.measureStart), 0)

	var unsent int64
	if cfg.Rate > 0 {
		// Slots due after the run gave up (an interruption) were never
		// due: they are not unsent, and have no latency.
		due := min(cfg.Warmup+cfg.Duration, max(gaveUp.Sub(p.start), cfg.Warmup))
		unsent = max(p.measuredSlots(cfg.Warmup, due)-total.requests, 0)
		// The unsent slots are the window's last: a slot is given up
		// only when it is taken after the drain's end (or the run's
		// interruption), and slots are taken in order (but for workers
		// that took two slots at one moment, due at most a few slots
		// apart: the bound below may be a slot's interval off).
		last := p.slotsBefore(due)
		if p.maxRequests > 0 {
			last = min(last, p.maxRequests)
		}
		for i := last - unsent; i < last; i++ {
			total.recordUnsent(p.start.Add(p.slotOffset(i)), gaveUp)
		}
	}
	return newResult(cfg, total, p.measureStart, elapsed, unsent), nil
}

// measuredSlots is the number of slots scheduled in [from, to) relative to
// start, excluding those beyond maxRequests.
func (p *plan) measuredSlots(from, to time.Duration) int64 {
	a, b := p.slotsBefore(from), p.slotsBefore(to)
	if p.maxRequests > 0 {
		a, b = min(a, p.maxRequests), min(b, p.maxRequests)
	}
	return b - a
}

// runClosed is wrk's loop: send, wait for the answer, send the next one.
// Latency runs from the actual send time.
func (w *worker) runClosed(p *plan) {
	for {
		select {
		case <-p.done:
			return
		default:
		}
		sent := time.Now()
		if !sent.Before(p.windowEnd) {
			return
		}
		if p.maxRequests > 0 && p.next.Add(1) > p.maxRequests {
			p.stopped.Store(true)
			return
		}
		o, uri := w.gen.next()
		status, err := w.do(o, uri)
		if !sent.Before(p.measureStart) {
			w.done(o, status, err, sent)
		}
	}
}

// runRate is wrk2's schedule: request i is due at start + i/rate. The worker
// takes the next due slot, sleeps if it is early and sends at once if it is
// late, and measures latency from the intended time. When every connection is
// busy, slots wait in the counter rather than being skipped, so the wait shows
// up in latency instead of being omitted.
func (w *worker) runRate(p *plan) {
	for {
		i := p.next.Add(1) - 1
		if p.maxRequests > 0 && i >= p.maxRequests {
			p.stopped.Store(true)
			return
		}
		intended := p.start.Add(p.slotOffset(i))
		if !intended.Before(p.windowEnd) {
			return
		}
		if !w.sleep.until(intended) {
			return
		}
		if time.Now().After(p.drainEnd) {
			return // counted as unsent by Run
		}
		select {
		case <-p.done:
			return
		default:
		}
		o, uri := w.gen.next()
		status, err := w.do(o, uri)
		if !intended.Before(p.measureStart) {
			w.done(o, status, err, intended)
		}
	}
}

// seedOf returns the configured seed or a time-based one.
func seedOf(cfg *Config) uint64 {
	if cfg.Seed != 0 {
		return cfg.Seed
	}
	return uint64(time.Now().UnixNano())
}
