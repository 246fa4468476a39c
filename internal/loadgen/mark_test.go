package loadgen

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The window holds the requests whose latency runs from its opening on
// and from before its closing, whenever they are recorded; it opens and
// closes once; two workers' windows merge.
func TestMarkWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	var m Mark
	m.Close(t0) // not open yet: nothing to close
	a, b := newRecorder(), newRecorder()
	a.keepMarked(&m)
	b.keepMarked(&m)
	a.record(opGet, 200, nil, t0.Add(100*ms), t0.Add(101*ms)) // before the opening

	m.Open(t0.Add(1000 * ms))
	m.Open(t0.Add(1500 * ms))                                                     // opened before: kept at 1 s
	b.record(opGet, 200, nil, t0.Add(900*ms), t0.Add(1200*ms))                    // started before the opening: out
	a.record(opGet, 200, nil, t0.Add(1000*ms), t0.Add(1004*ms))                   // in: 4 ms
	b.record(opGet, 503, nil, t0.Add(1100*ms), t0.Add(1120*ms))                   // in: a failure, 20 ms
	b.record(opGet, 0, fasthttp.ErrDialTimeout, t0.Add(1200*ms), t0.Add(1200*ms)) // in: no answer, no latency

	m.Close(t0.Add(2000 * ms))
	m.Close(t0.Add(3000 * ms))                                  // closed before: kept at 2 s
	a.record(opGet, 200, nil, t0.Add(1900*ms), t0.Add(2600*ms)) // started before the closing: in, 700 ms
	a.record(opGet, 200, nil, t0.Add(2000*ms), t0.Add(2001*ms)) // at the closing: out

	total := newRecorder()
	total.merge(a)
	total.merge(b)
	w := markedWindow(&m, total, t0.Add(500*ms))
	if w == nil {
		t.Fatal("no window")
	}
	eq(t, 0.5, w.FromS, "opened 0.5 s after the origin")
	if w.ToS == nil {
		t.Fatal("a closed window has its end")
	}
	eq(t, 1.5, *w.ToS, "closed 1.5 s after the origin")
	eq(t, int64(4), w.Requests, "requests in the window")
	eq(t, int64(2), w.Failures, "the 503 and the dial failure")
	near(t, 20000, w.Latency.P50, 20, "p50: of 4 ms, 20 ms and 700 ms")
	near(t, 700_000, w.Latency.P100, 1000, "max: the request that started inside and ended after the closing")
}

// A run whose window was never opened reports none; one opened and never
// closed lasts to the end, in the JSON and the text report.
func TestRunMark(t *testing.T) {
	l := newRequestLog()
	url := startServer(t, okHandler(l))
	cfg := testConfig(url)
	cfg.Rate = 200
	cfg.Duration = 600 * time.Millisecond
	cfg.Mark = new(Mark)
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	if res.Marked != nil {
		t.Fatalf("a window never opened is reported: %+v", res.Marked)
	}

	cfg.Mark = new(Mark)
	cfg.Mark.Open(time.Now().Add(-time.Hour)) // open before the run
	res, err = Run(context.Background(), cfg)
	noErr(t, err)
	if res.Marked == nil || res.Marked.ToS != nil {
		t.Fatalf("want an open window, got %+v", res.Marked)
	}
	eq(t, res.Requests, res.Marked.Requests, "every request of the run is in a window open throughout")
	var b strings.Builder
	noErr(t, res.WriteJSON(&b))
	var back struct {
		Marked *MarkedWindow `json:"marked"`
	}
	noErr(t, json.Unmarshal([]byte(b.String()), &back))
	if back.Marked == nil || back.Marked.Requests != res.Requests {
		t.Fatalf("JSON's window: %s", b.String())
	}
	b.Reset()
	noErr(t, res.WriteText(&b))
	if !strings.Contains(b.String(), "Marked window") || !strings.Contains(b.String(), "to the end") {
		t.Fatalf("text report without the window:\n%s", b.String())
	}
}
