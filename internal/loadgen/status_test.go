package loadgen

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

var errTimeoutForTest = fasthttp.ErrTimeout

// A server that answers 404 for keys ≡ 0 (mod 3) and 500 for keys ≡ 1: both
// are counted by status and as non-2xx, none as transport errors.
func TestStatusAccounting(t *testing.T) {
	l := newRequestLog()
	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		l.add(ctx)
		id := string(ctx.QueryArgs().Peek("id"))
		n, err := strconv.Atoi(id[1:])
		if err != nil {
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			return
		}
		switch n % 3 {
		case 0:
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		case 1:
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		default:
			ctx.SetStatusCode(fasthttp.StatusOK)
		}
	})
	cfg := testConfig(target)
	cfg.MaxRequests = 900
	cfg.Duration = 10 * time.Second
	res, err := Run(context.Background(), cfg)
	noErr(t, err)

	eq(t, int64(900), res.Requests, "requests")
	eq(t, res.Requests, res.Status["200"]+res.Status["404"]+res.Status["500"], "status total")
	eq(t, 3, len(res.Status), "codes in %v", res.Status)
	for _, code := range []string{"200", "404", "500"} {
		near(t, 300, res.Status[code], 75, "status %s", code)
	}
	eq(t, res.Status["404"]+res.Status["500"], res.Non2xx, "non-2xx")
	eq(t, ErrorCounts{}, res.Errors, "errors")
	eq(t, res.Requests, res.hist.TotalCount(), "every answer has a latency")
}

// Nothing listens on the target: every request is a connect error, counted
// as a request, and nothing is recorded as a status or latency.
func TestRefusedConnectionsAreCounted(t *testing.T) {
	for _, rate := range []float64{0, 200} {
		cfg := testConfig(refusedTarget(t))
		cfg.Rate = rate
		cfg.Duration = 300 * time.Millisecond
		res, err := Run(context.Background(), cfg)
		noErr(t, err)

		ok(t, res.Requests > 0, "rate %v: no requests", rate)
		eq(t, res.Requests, res.Errors.Connect, "connect errors at rate %v (%+v)", rate, res.Errors)
		eq(t, int64(0), res.Errors.Timeout+res.Errors.Other, "other errors at rate %v", rate)
		eq(t, 0, len(res.Status), "statuses at rate %v", rate)
		eq(t, int64(0), res.hist.TotalCount(), "latencies at rate %v", rate)
		if rate > 0 {
			near(t, 60, res.Requests, 2, "requests at rate %v", rate)
		}
	}
}

// A server slower than --timeout yields timeout errors whose latency is
// recorded, so that the tail shows them.
func TestTimeoutsAreCounted(t *testing.T) {
	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		time.Sleep(300 * time.Millisecond) // a server slower than the timeout is the behaviour under test
	})
	cfg := testConfig(target)
	cfg.Timeout = 100 * time.Millisecond
	cfg.MaxRequests = 4
	res, err := Run(context.Background(), cfg)
	noErr(t, err)

	eq(t, int64(4), res.Requests, "requests")
	eq(t, int64(4), res.Errors.Timeout, "timeouts (%+v)", res.Errors)
	ok(t, res.Latency.P50 >= 100_000, "p50 %dµs", res.Latency.P50)
}

func TestClassifyErr(t *testing.T) {
	eq(t, errTimeout, classifyErr(fasthttp.ErrTimeout), "ErrTimeout")
	eq(t, errConnect, classifyErr(fasthttp.ErrDialTimeout), "ErrDialTimeout")
	eq(t, errOther, classifyErr(fasthttp.ErrConnectionClosed), "ErrConnectionClosed")
	eq(t, errOther, classifyErr(errors.New("boom")), "plain error")
}
