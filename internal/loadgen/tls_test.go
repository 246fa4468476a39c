package loadgen

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/testpki"
)

// An https:// target is loaded over TLS when its CA is given (TLSCA);
// without it the server's certificate is not trusted and every request
// fails.
func TestHTTPSTarget(t *testing.T) {
	ca := testpki.NewCA(t, "load")
	certFile, keyFile, _ := ca.Issue("server")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	noErr(t, err)
	l := newRequestLog()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ok(t, ctx.IsTLS(), "a request over plain HTTP")
		okHandler(l)(ctx)
	}, Logger: quiet{}} // the untrusted handshakes below are expected
	go func() { _ = srv.ServeTLS(ln, certFile, keyFile) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
	})

	cfg := testConfig("https://" + ln.Addr().String())
	cfg.Workload = WorkloadMixed
	cfg.MaxRequests = 100
	cfg.TLSCA = ca.File
	res, err := Run(context.Background(), cfg)
	noErr(t, err)
	eq(t, int64(100), res.Requests, "requests")
	eq(t, ErrorCounts{}, res.Errors, "errors")
	eq(t, 100, l.total(), "requests served")

	cfg.TLSCA = ""
	cfg.MaxRequests = 4
	res, err = Run(context.Background(), cfg)
	noErr(t, err)
	eq(t, int64(4), res.Errors.Connect+res.Errors.Other, "untrusted certificate (%+v)", res.Errors)
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
