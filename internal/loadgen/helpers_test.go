package loadgen

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// startServer serves h on 127.0.0.1 with an OS-chosen port and returns its
// base URL. The server is shut down when the test ends.
func startServer(t testing.TB, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	noErr(t, err)
	srv := &fasthttp.Server{Handler: h, MaxRequestBodySize: 4 << 20}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
	})
	return "http://" + ln.Addr().String()
}

// refusedTarget returns a loopback URL on which nothing listens.
func refusedTarget(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	noErr(t, ln.Close())
	return "http://" + addr
}

// testConfig is DefaultConfig scaled down for tests, with a fixed seed.
func testConfig(targets ...string) Config {
	c := DefaultConfig()
	c.Targets = targets
	c.Connections = 2
	c.Duration = time.Second
	c.Keyspace = 1000
	c.ValueSize = 16
	c.Timeout = 2 * time.Second
	c.Seed = 42
	return c
}

// requestLog records what a test server received.
type requestLog struct {
	mu      sync.Mutex
	methods map[string]int
	keys    map[string]int // id -> count
	queries []string
}

func newRequestLog() *requestLog {
	return &requestLog{methods: map[string]int{}, keys: map[string]int{}}
}

func (l *requestLog) add(ctx *fasthttp.RequestCtx) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.methods[string(ctx.Method())]++
	l.keys[string(ctx.QueryArgs().Peek("id"))]++
	if len(l.queries) < 100 {
		l.queries = append(l.queries, string(ctx.QueryArgs().QueryString()))
	}
}

func (l *requestLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.methods {
		n += c
	}
	return n
}

// okHandler answers like the entity API and logs every request.
func okHandler(l *requestLog) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		l.add(ctx)
		switch string(ctx.Method()) {
		case fasthttp.MethodPut:
			ctx.SetStatusCode(fasthttp.StatusCreated)
		case fasthttp.MethodDelete:
			ctx.SetStatusCode(fasthttp.StatusAccepted)
		default:
			ctx.SetStatusCode(fasthttp.StatusOK)
			ctx.SetBodyString("value")
		}
	}
}
