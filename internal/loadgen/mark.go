package loadgen

import (
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Mark is a window of a run marked while the run goes on, whose requests
// are also summed apart (Result.Marked): the clients' latency while a
// membership change or a rebuild was at work, from the same run as the
// seconds around it. dhtkv-load opens it on SIGUSR1 and closes it on
// SIGUSR2, so that a script marks what it started and saw end.
//
// A request is in the window by the time its latency runs from (its
// intended send time on a constant-rate schedule, as in the timeline):
// at or after the opening and before the closing. A request is recorded
// after it started, so one recorded before the opening started before it
// and one recorded before the closing started before that: deciding at
// record time with what is known then is exact, but for a request
// recorded between Open's or Close's reading of the clock and its store
// (nanoseconds, unless that thread is descheduled). Times are compared on
// the monotonic clock, so a step of the wall clock moves nothing. The
// window opens once and closes once; a window never closed lasts to the
// run's end. Its methods are safe for concurrent use.
type Mark struct {
	// from and to are 1 + nanoseconds since markEpoch; 0 while not set.
	from, to atomic.Int64
}

// markEpoch is the monotonic origin of every Mark's times.
var markEpoch = time.Now()

func sinceEpoch(t time.Time) int64 { return int64(t.Sub(markEpoch)) + 1 }

func fromEpoch(n int64) time.Time { return markEpoch.Add(time.Duration(n - 1)) }

// Open opens the window at t, unless it was opened before.
func (m *Mark) Open(t time.Time) { m.from.CompareAndSwap(0, sinceEpoch(t)) }

// Close closes the window at t, if it is open and was not closed before.
func (m *Mark) Close(t time.Time) {
	if m.from.Load() != 0 {
		m.to.CompareAndSwap(0, sinceEpoch(t))
	}
}

// Holds reports whether a request whose latency runs from start is in
// the window.
func (m *Mark) Holds(start time.Time) bool {
	from := m.from.Load()
	if from == 0 {
		return false
	}
	s := sinceEpoch(start)
	to := m.to.Load()
	return s >= from && (to == 0 || s < to)
}

// MarkedWindow sums up the requests of a Mark's window.
type MarkedWindow struct {
	// FromS and ToS are the window's opening and closing in seconds after
	// the start of the measured window (negative: during the warm-up);
	// ToS is absent if it was never closed.
	FromS    float64  `json:"from_s"`
	ToS      *float64 `json:"to_s,omitempty"`
	Requests int64    `json:"requests"`
	// Failures are the requests that got no 2xx answer (a GET's 404
	// included), as the timeline counts them.
	Failures int64 `json:"failures"`
	// Unsent are the window's requests never sent (Result.Unsent); the
	// latencies include their lower bounds.
	Unsent  int64          `json:"unsent,omitempty"`
	Latency LatencySummary `json:"latency_us"`
	// LatencyByOp is a mixed workload's Latency for its GETs and PUTs
	// apart (Result.LatencyByOp).
	LatencyByOp map[string]LatencySummary `json:"latency_by_op_us,omitempty"`
}

// marked is what one worker recorded inside the window; hist is made
// with the window's first request (a histogram is some 140 KB, and a
// run with no window needs none).
type marked struct {
	hist     *hdrhistogram.Histogram
	requests int64
	failures int64
	unsent   int64
	ops      *byOp // a mixed workload's, made with its first request
}

func (m *marked) merge(o *marked) {
	if o.hist == nil {
		return
	}
	if m.hist == nil {
		m.hist = newHistogram()
	}
	m.hist.Merge(o.hist)
	m.requests += o.requests
	m.failures += o.failures
	m.unsent += o.unsent
	if o.ops != nil {
		if m.ops == nil {
			m.ops = &byOp{}
		}
		m.ops.merge(o.ops)
	}
}

// markedWindow is the summary of rec's window, nil when the window was
// never opened.
func markedWindow(mark *Mark, rec *recorder, origin time.Time) *MarkedWindow {
	if mark == nil || rec.marked == nil || mark.from.Load() == 0 {
		return nil
	}
	h := rec.marked.hist
	if h == nil { // no request was due in the window
		h = newHistogram()
	}
	w := &MarkedWindow{
		FromS:    roundTo(fromEpoch(mark.from.Load()).Sub(origin).Seconds(), 3),
		Requests: rec.marked.requests,
		Failures: rec.marked.failures,
		Unsent:   rec.marked.unsent,
		Latency:  summarize(h),
	}
	w.LatencyByOp = rec.marked.ops.summaries()
	if to := mark.to.Load(); to != 0 {
		s := roundTo(fromEpoch(to).Sub(origin).Seconds(), 3)
		w.ToS = &s
	}
	return w
}
