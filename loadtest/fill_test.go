package loadtest

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
