package loadgen

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// The timeline: a run's latency second by second, so that a stall shows
// as a spike at its time instead of vanishing into the run's percentiles.
// A request counts in the second its latency runs from (its intended send
// time on a constant-rate schedule), counted from the start of the
// measured window.
//
// Each worker keeps one small histogram per second it recorded in (one
// significant digit: values within 10%, some 3 KiB each), merged with the
// others' once the run ends; a second's percentiles are therefore coarse,
// its count and maximum exact to the microsecond bucket.

// timelineDigits is the precision of a second's histogram.
const timelineDigits = 1

// TimelinePoint is one second of a run.
type TimelinePoint struct {
	// Second is how many whole seconds after the start of the measured
	// window the requests counted here were due (or sent).
	Second   int   `json:"second"`
	Requests int64 `json:"requests"`
	// Failures are the requests that got no 2xx answer: non-2xx answers
	// and transport errors.
	Failures int64 `json:"failures"`
	// Unsent are the requests due in this second that were never sent
	// (Result.Unsent); the latencies include their lower bounds.
	Unsent int64 `json:"unsent,omitempty"`
	P50US  int64 `json:"p50_us"`
	P99US  int64 `json:"p99_us"`
	MaxUS  int64 `json:"max_us"`
}

// second is what one worker recorded in one second.
type second struct {
	hist     *hdrhistogram.Histogram
	requests int64
	failures int64
	unsent   int64
}

// timeline is one worker's seconds, from origin.
type timeline struct {
	origin time.Time
	secs   []*second
}

// at returns the second start falls in, made on first use; nil before
// origin.
func (t *timeline) at(start time.Time) *second {
	d := start.Sub(t.origin)
	if d < 0 {
		return nil
	}
	i := int(d / time.Second)
	for len(t.secs) <= i {
		t.secs = append(t.secs, nil)
	}
	if t.secs[i] == nil {
		t.secs[i] = &second{hist: hdrhistogram.New(histMinUS, histMaxUS, timelineDigits)}
	}
	return t.secs[i]
}

// merge adds o's seconds into t.
func (t *timeline) merge(o *timeline) {
	for i, s := range o.secs {
		if s == nil {
			continue
		}
		for len(t.secs) <= i {
			t.secs = append(t.secs, nil)
		}
		if t.secs[i] == nil {
			t.secs[i] = &second{hist: hdrhistogram.New(histMinUS, histMaxUS, timelineDigits)}
		}
		t.secs[i].hist.Merge(s.hist)
		t.secs[i].requests += s.requests
		t.secs[i].failures += s.failures
		t.secs[i].unsent += s.unsent
	}
}

// points returns the timeline, a point for every second up to the last
// one recorded (an empty second is a point of 0 requests: a full stall).
func (t *timeline) points() []TimelinePoint {
	out := make([]TimelinePoint, len(t.secs))
	for i, s := range t.secs {
		out[i].Second = i
		if s == nil {
			continue
		}
		out[i].Requests, out[i].Failures, out[i].Unsent = s.requests, s.failures, s.unsent
		if s.hist.TotalCount() > 0 {
			out[i].P50US = s.hist.ValueAtPercentile(50)
			out[i].P99US = s.hist.ValueAtPercentile(99)
			out[i].MaxUS = s.hist.Max()
		}
	}
	return out
}
