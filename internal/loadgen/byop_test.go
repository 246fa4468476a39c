package loadgen

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A mix's GETs and PUTs are summed up apart, in the run and in its marked
// window, by the rule of the run's histogram: an answer or a timeout is
// timed, a request that got no answer otherwise is not; two workers merge.
func TestLatencyByOp(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	var m Mark
	a, b := newRecorder(), newRecorder()
	for _, r := range []*recorder{a, b} {
		r.keepMarked(&m)
		r.keepByOp()
	}
	a.record(opGet, 200, nil, t0, t0.Add(1*ms))
	b.record(opGet, 404, nil, t0, t0.Add(2*ms)) // an answer: timed
	a.record(opPut, 201, nil, t0, t0.Add(10*ms))
	b.record(opPut, 0, fasthttp.ErrDialTimeout, t0, t0) // no answer: not timed
	m.Open(t0.Add(100 * ms))
	b.record(opPut, 0, errTimeoutForTest, t0.Add(100*ms), t0.Add(2100*ms)) // a timeout: timed, in the window
	a.record(opGet, 200, nil, t0.Add(200*ms), t0.Add(203*ms))              // in the window
	b.record(opDelete, 200, nil, t0.Add(300*ms), t0.Add(400*ms))           // not split out

	total := newRecorder()
	total.merge(a)
	total.merge(b)
	res := newResult(Config{Targets: []string{"127.0.0.1:1"}, Workload: WorkloadMixed, Mark: &m}, total, t0, time.Second, 0)
	ops := res.LatencyByOp
	eq(t, 2, len(ops), "operations: %v", ops)
	near(t, 3000, ops["get"].P100, 5, "GET max")
	near(t, 2000, ops["get"].P50, 2, "GET p50: of 1, 2 and 3 ms")
	near(t, 2_000_000, ops["put"].P100, 2000, "PUT max: the timeout")
	near(t, 10_000, ops["put"].P50, 10, "PUT p50")
	if res.Marked == nil {
		t.Fatal("no window")
	}
	in := res.Marked.LatencyByOp
	near(t, 3000, in["get"].P100, 5, "the window's GET")
	near(t, 2_000_000, in["put"].P50, 2000, "the window's PUT")

	var text strings.Builder
	noErr(t, res.WriteText(&text))
	for _, want := range []string{"  GET: p50 2.00ms", "  PUT: p50 10.01ms", "    GET: p50 3.00ms"} {
		ok(t, strings.Contains(text.String(), want), "text report lacks %q:\n%s", want, text.String())
	}

	// A workload that is not a mix has no split.
	single := newRecorder()
	single.record(opGet, 200, nil, t0, t0.Add(ms))
	eq(t, 0, len(newResult(Config{Workload: WorkloadGet}, single, t0, time.Second, 0).LatencyByOp), "a GET workload's split")
}

// A mixed run reports its PUTs apart from its GETs, in the JSON too.
func TestRunLatencyByOp(t *testing.T) {
	url := startServer(t, func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPut() {
			time.Sleep(5 * time.Millisecond) // the slow operation
			ctx.SetStatusCode(fasthttp.StatusCreated)
		}
	})
	cfg := testConfig(url)
	cfg.Workload = WorkloadMixed
	cfg.ReadRatio = 0.5
	cfg.Rate = 400
	cfg.Duration = 500 * time.Millisecond
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	var b strings.Builder
	noErr(t, res.WriteJSON(&b))
	var back struct {
		ByOp map[string]LatencySummary `json:"latency_by_op_us"`
	}
	noErr(t, json.Unmarshal([]byte(b.String()), &back))
	ok(t, back.ByOp["put"].P50 >= 5000, "PUT p50 %d µs, below the handler's 5 ms", back.ByOp["put"].P50)
	ok(t, back.ByOp["get"].P50 < back.ByOp["put"].P50, "GET p50 %d µs not below PUT's %d µs", back.ByOp["get"].P50, back.ByOp["put"].P50)
}
