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
// record time with what is known then is exact. The window opens once
// and closes once; a window never closed lasts to the run's end. Its
// methods are safe for concurrent use.
type Mark struct {
	from, to atomic.Int64 // Unix nanoseconds; 0 while not set
}

// Open opens the window at t, unless it was opened before.
func (m *Mark) Open(t time.Time) { m.from.CompareAndSwap(0, t.UnixNano()) }

// Close closes the window at t, if it is open and was not closed before.
func (m *Mark) Close(t time.Time) {
	if m.from.Load() != 0 {
		m.to.CompareAndSwap(0, t.UnixNano())
	}
}

// Holds reports whether a request whose latency runs from start is in
// the window.
func (m *Mark) Holds(start time.Time) bool {
	from := m.from.Load()
	if from == 0 {
		return false
	}
	s := start.UnixNano()
	to := m.to.Load()
	return s >= from && (to == 0 || s < to)
}

// MarkedWindow sums up the requests of a Mark's window.
type MarkedWindow struct {
	// FromS and ToS are the window's opening and closing in seconds after
	// the start of the measured window (negative: during the warm-up);
	// ToS is absent if it was never closed.
	FromS    float64        `json:"from_s"`
	ToS      *float64       `json:"to_s,omitempty"`
	Requests int64          `json:"requests"`
	Failures int64          `json:"failures"`
	Latency  LatencySummary `json:"latency_us"`
}

// marked is what one worker recorded inside the window.
type marked struct {
	hist     *hdrhistogram.Histogram
	requests int64
	failures int64
}

func (m *marked) merge(o *marked) {
	m.hist.Merge(o.hist)
	m.requests += o.requests
	m.failures += o.failures
}

// markedWindow is the summary of rec's window, nil when the window was
// never opened.
func markedWindow(mark *Mark, rec *recorder, origin time.Time) *MarkedWindow {
	if mark == nil || rec.marked == nil || mark.from.Load() == 0 {
		return nil
	}
	w := &MarkedWindow{
		FromS:    roundTo(time.Unix(0, mark.from.Load()).Sub(origin).Seconds(), 3),
		Requests: rec.marked.requests,
		Failures: rec.marked.failures,
		Latency:  summarize(rec.marked.hist),
	}
	if to := mark.to.Load(); to != 0 {
		s := roundTo(time.Unix(0, to).Sub(origin).Seconds(), 3)
		w.ToS = &s
	}
	return w
}
