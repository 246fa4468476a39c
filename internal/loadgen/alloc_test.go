package loadgen

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The hot path (pick op, build URI, send, record) must not allocate per
// request once buffers are warm; fasthttp itself allocates nothing here.
func TestHotPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	// The server shares the process, and AllocsPerRun counts its
	// allocations too: it must not allocate either.
	cfg := testConfig(startServer(t, func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPut() {
			ctx.SetStatusCode(fasthttp.StatusCreated)
		}
	}))
	cfg.Connections = 1
	cfg.Workload = WorkloadMixed
	cfg.Ack, cfg.From = 2, 3
	workers, err := newWorkers(&cfg, 1)
	noErr(t, err)
	w := workers[0]
	defer w.release()
	// with a timeline and an open marked window, as dhtkv-load runs
	m := new(Mark)
	m.Open(time.Now())
	w.rec.keepTimeline(time.Now())
	w.rec.keepMarked(m)

	step := func() {
		o, uri := w.gen.next()
		sent := time.Now()
		status, err := w.do(o, uri)
		w.done(o, status, err, sent)
	}
	for range 100 {
		step() // warm up connection and buffers
	}
	allocs := testing.AllocsPerRun(500, step)
	ok(t, allocs < 0.1, "%v allocations per request", allocs)

	// The constant-rate wait allocates nothing either.
	wait := func() { w.sleep.until(time.Now().Add(20 * time.Microsecond)) }
	allocs = testing.AllocsPerRun(200, wait)
	ok(t, allocs < 0.1, "%v allocations per wait", allocs)
	eq(t, int64(0), w.rec.failures(), "failures")
}
