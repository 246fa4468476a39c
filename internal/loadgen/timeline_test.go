package loadgen

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The timeline puts each request in the second its latency runs from, and
// keeps a second without requests as a point of zero (a stall shows); two
// workers' timelines merge second by second.
func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	a, b := newRecorder(), newRecorder()
	a.keepTimeline(t0)
	b.keepTimeline(t0)
	ms := time.Millisecond
	a.record(opGet, 200, nil, t0.Add(100*ms), t0.Add(101*ms))                     // second 0: 1 ms
	b.record(opGet, 200, nil, t0.Add(900*ms), t0.Add(903*ms))                     // second 0: 3 ms
	a.record(opGet, 201, nil, t0.Add(2500*ms), t0.Add(4500*ms))                   // second 2: a 2 s stall
	b.record(opGet, 500, nil, t0.Add(2600*ms), t0.Add(2610*ms))                   // second 2: a failure, 10 ms
	b.record(opGet, 0, fasthttp.ErrDialTimeout, t0.Add(2700*ms), t0.Add(2700*ms)) // second 2: no answer, no latency
	a.record(opGet, 200, nil, t0.Add(-ms), t0)                                    // before the window: not in it
	total := newRecorder()
	total.merge(a)
	total.merge(b)
	got := total.timeline.points()
	if len(got) != 3 {
		t.Fatalf("want 3 seconds, got %+v", got)
	}
	eq(t, 0, got[0].Second, "second 0")
	eq(t, int64(2), got[0].Requests, "second 0 requests")
	// One significant digit: values within 10%, reported high.
	near(t, 1000, got[0].P50US, 100, "second 0 p50")
	near(t, 3000, got[0].P99US, 300, "second 0 p99")
	near(t, 3000, got[0].MaxUS, 300, "second 0 max")
	eq(t, TimelinePoint{Second: 1}, got[1], "second 1: nothing was due")
	eq(t, int64(3), got[2].Requests, "second 2 requests")
	eq(t, int64(2), got[2].Failures, "second 2: the 500 and the dial failure")
	near(t, 2_000_000, got[2].MaxUS, 200_000, "second 2: the stall's latency, within the histogram's 10%%")
}

// A run with Timeline reports every measured request in its seconds, in
// its JSON; one without has no timeline.
func TestRunTimeline(t *testing.T) {
	l := newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l)))
	cfg.Rate = 200
	cfg.Duration = 1500 * time.Millisecond
	cfg.Timeline = true
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	var sum int64
	for _, p := range res.Timeline {
		sum += p.Requests
	}
	eq(t, res.Requests, sum, "the timeline holds every measured request")
	ok(t, len(res.Timeline) >= 2, "a 1.5 s run spans two seconds: %+v", res.Timeline)
	b, err := json.Marshal(res)
	noErr(t, err)
	var out map[string]any
	noErr(t, json.Unmarshal(b, &out))
	_, has := out["timeline"]
	ok(t, has, "the JSON has the timeline")

	cfg.Timeline, cfg.Duration = false, 200*time.Millisecond
	res, err = Run(context.Background(), cfg)
	noErr(t, err)
	eq(t, 0, len(res.Timeline), "no timeline unless asked")
}
