package loadgen

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// On a constant-rate schedule latency runs from the intended send time,
// so it is the generator's lateness plus the answer's time: up to
// Duration+Drain+Timeout. The histograms tracked 60 s: a request due at
// the start of a 60 s window (the benchmarks' standard) and answered 90 s
// later was reported as 60 s.
func TestLatencyBeyondAMinuteIsNotClipped(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rate = 1000
	cfg.Duration = 60 * time.Second // accepted by Validate, as is Drain 10s
	noErr(t, cfg.Validate())

	rec := newRecorder()
	due := time.Now()
	rec.record(opGet, 200, nil, due, due.Add(time.Millisecond))
	rec.record(opGet, 200, nil, due, due.Add(90*time.Second)) // 88s late, 2s to answer
	res := newResult(cfg, rec, due, cfg.Duration, 0)
	ok(t, res.Latency.P100 >= 90_000_000, "max %dµs: a 90s latency reported as %.1fs", res.Latency.P100, float64(res.Latency.P100)/1e6)
}

// stallingServer answers its first fast requests at once and then hangs
// each request for hang.
func stallingServer(t *testing.T, fast int64, hang time.Duration) string {
	var n atomic.Int64
	return startServer(t, func(ctx *fasthttp.RequestCtx) {
		if n.Add(1) > fast {
			time.Sleep(hang) // a server that stalls is the behaviour under test
		}
		ctx.SetStatusCode(fasthttp.StatusOK)
	})
}

// The server stalls halfway through the window. Half of the scheduled
// requests are never sent (the drain ends first); they were left out of
// the histogram, so the percentiles described only the requests sent
// before the stall: p75 and p90 read sub-millisecond although half of
// what was due waited more than 200 ms and got no answer at all. They
// now count at their lower bound (recorder.recordUnsent).
func TestUnsentRequestsCountInThePercentiles(t *testing.T) {
	cfg := testConfig(stallingServer(t, 50, 1500*time.Millisecond))
	cfg.Rate = 100 // 100 slots in the 1s window; 50 answered before the stall
	cfg.Timeout = time.Second
	cfg.Drain = 200 * time.Millisecond
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	t.Logf("requests %d unsent %d timeouts %d p50 %dµs p75 %dµs p90 %dµs p99 %dµs",
		res.Requests, res.Unsent, res.Errors.Timeout, res.Latency.P50, res.Latency.P75, res.Latency.P90, res.Latency.P99)
	ok(t, res.Unsent >= 40, "unsent %d: the scenario needs the stall to leave slots unsent", res.Unsent)
	// Every unsent slot waited at least drainEnd - intended >= 200ms.
	ok(t, res.Latency.P75 >= 200_000, "p75 %dµs hides %d of %d due requests that waited >= 200ms",
		res.Latency.P75, res.Unsent, res.Requests+res.Unsent)
}

// The timeline has one point per second of the measured window (README).
// A stall that lasts to the end of the window leaves its seconds without
// a request sent: they had no point at all, and the stall vanished from
// the timeline.
func TestTimelineCoversTheWindow(t *testing.T) {
	cfg := testConfig(stallingServer(t, 10, 1200*time.Millisecond))
	cfg.Rate = 20
	cfg.Duration = 3 * time.Second
	cfg.Timeout = time.Second
	cfg.Drain = 0
	cfg.Timeline = true
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	t.Logf("requests %d unsent %d timeline %+v", res.Requests, res.Unsent, res.Timeline)
	eq(t, 3, len(res.Timeline), "timeline points for a 3s window")
}

// closingServer reads each request, waits, and closes the connection
// without an answer (a node killed or restarting, a proxy cutting it).
func closingServer(t *testing.T, wait time.Duration) string {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	noErr(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" { // end of a bodiless GET's header
						time.Sleep(wait) // the stall before the reset is the behaviour under test
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// A request that stalled 300 ms and then lost its connection is an
// "other" error; it was left out of the histogram, like an instant
// refusal, so a server that hangs and then drops its connections
// reported no latency at all.
func TestLostConnectionKeepsItsLatency(t *testing.T) {
	cfg := testConfig(closingServer(t, 300*time.Millisecond))
	cfg.Rate = 20
	cfg.Duration = 500 * time.Millisecond
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	t.Logf("requests %d errors %+v p50 %dµs max %dµs", res.Requests, res.Errors, res.Latency.P50, res.Latency.P100)
	ok(t, res.Errors.Other > 0, "want the closed connections as errors: %+v", res.Errors)
	ok(t, res.Latency.P50 >= 300_000, "p50 %dµs: every request waited >= 300ms", res.Latency.P50)
}

// Validate accepted any rate in (0, 1e8]. Below about 1.08e-10/s the
// interval exceeds MaxInt64 ns: slotOffset's float-to-int64 conversion
// overflowed (to MinInt64 on amd64), every slot after the first was "due"
// 292 years ago, the workers sent flat out without recording anything
// until the drain's end, and slotsBefore then never returned. A rate
// below one an hour (MaxDuration) is refused.
func TestTinyRateRefused(t *testing.T) {
	l := newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l)))
	cfg.Rate = 1e-11
	cfg.Duration = 200 * time.Millisecond
	cfg.Drain = 0
	_, err := Run(context.Background(), cfg)
	ok(t, err != nil && strings.Contains(err.Error(), "rate 1e-11: must be 0 (closed loop) or in [1/1h0m0s, 1e8] requests/s"), "Run: %v", err)
	eq(t, 0, l.total(), "requests sent")
	cfg.Rate = 1 / MaxDuration.Seconds()
	noErr(t, cfg.Validate())
}
