package loadgen

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestFillWritesEachKeyOnce(t *testing.T) {
	l := newRequestLog()
	var bodyLen int
	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		l.add(ctx)
		l.mu.Lock()
		bodyLen = len(ctx.PostBody())
		l.mu.Unlock()
		ctx.SetStatusCode(fasthttp.StatusCreated)
	})
	cfg := testConfig(target, target) // two "targets": keys must still not repeat
	cfg.Connections = 4
	cfg.Keyspace = 10 // fill does not depend on the run's keyspace
	cfg.ValueSize = 100
	const n = 1000
	res, err := Fill(context.Background(), cfg, n)
	noErr(t, err)

	eq(t, int64(n), res.Keys, "keys")
	ok(t, res.Rate() > 0, "rate %v", res.Rate())
	eq(t, map[string]int{"PUT": n}, l.methods, "methods")
	eq(t, n, len(l.keys), "distinct keys")
	for i := range n {
		eq(t, 1, l.keys[fmt.Sprintf("k%d", i)], "writes of k%d", i)
	}
	eq(t, 100, bodyLen, "value size")
}

func TestFillFailsLoudly(t *testing.T) {
	cfg := testConfig(refusedTarget(t))
	res, err := Fill(context.Background(), cfg, 10)
	if err == nil || !strings.Contains(err.Error(), "10 of 10 PUTs failed") {
		t.Errorf("fill to a refused port: err = %v", err)
	}
	eq(t, int64(10), res.Errors.Connect, "connect errors")

	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	})
	cfg = testConfig(target)
	res, err = Fill(context.Background(), cfg, 10)
	ok(t, err != nil, "fill answered by 503s succeeded")
	eq(t, int64(10), res.Non2xx, "non-2xx")

	_, err = Fill(context.Background(), cfg, 0)
	ok(t, err != nil, "fill 0 accepted")
}

// A PUT answered 504 (or 503) is sent again: a cluster at saturation may
// miss its replica timeout now and then, and the keyspace must still end
// up complete. Other failures are not retried.
func TestFillRetriesGatewayTimeouts(t *testing.T) {
	l := newRequestLog()
	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		l.add(ctx)
		l.mu.Lock()
		first := l.keys[string(ctx.QueryArgs().Peek("id"))] == 1
		l.mu.Unlock()
		if first {
			ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusCreated)
	})
	cfg := testConfig(target)
	res, err := Fill(context.Background(), cfg, 50)
	noErr(t, err)
	eq(t, int64(50), res.Keys, "keys")
	eq(t, int64(50), res.Retried, "retried")
	eq(t, int64(0), res.Non2xx, "non-2xx")
	for i := range 50 {
		eq(t, 2, l.keys[fmt.Sprintf("k%d", i)], "writes of k%d", i)
	}

	// Always 504: given up after fillAttempts, and reported.
	target = startServer(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusGatewayTimeout) })
	res, err = Fill(context.Background(), testConfig(target), 5)
	ok(t, err != nil, "a fill answered by 504s succeeded")
	eq(t, int64(5), res.Non2xx, "non-2xx")
	eq(t, int64(5*(fillAttempts-1)), res.Retried, "retried")

	// 400 is the client's fault: not retried.
	target = startServer(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusBadRequest) })
	res, _ = Fill(context.Background(), testConfig(target), 5)
	eq(t, int64(0), res.Retried, "retried")
}

// ReadAll GETs every key once; a key never written (404) is an answer,
// a 503 is retried and then a failure, as in Fill.
func TestReadAllReadsEachKeyOnce(t *testing.T) {
	l := newRequestLog()
	target := startServer(t, func(ctx *fasthttp.RequestCtx) {
		l.add(ctx)
		if strings.HasPrefix(string(ctx.QueryArgs().Peek("id")), "k7") {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		}
	})
	cfg := testConfig(target, target)
	cfg.Connections = 4
	const n = 500
	res, err := ReadAll(context.Background(), cfg, n)
	noErr(t, err)
	eq(t, int64(n), res.Keys, "keys")
	eq(t, map[string]int{"GET": n}, l.methods, "methods")
	eq(t, n, len(l.keys), "distinct keys")
	for i := range n {
		eq(t, 1, l.keys[fmt.Sprintf("k%d", i)], "reads of k%d", i)
	}

	busy := startServer(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusServiceUnavailable) })
	res, err = ReadAll(context.Background(), testConfig(busy), 10)
	if err == nil || !strings.Contains(err.Error(), "10 of 10 GETs failed") {
		t.Errorf("read-all answered by 503s: err = %v", err)
	}
	eq(t, int64(10), res.Non2xx, "non-2xx")
}
