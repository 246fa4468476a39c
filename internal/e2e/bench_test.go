package e2e_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

const benchKeys = 4096

var benchValue = []byte(strings.Repeat("x", 256))

func benchURIs(base string) []string {
	uris := make([]string, benchKeys)
	for i := range uris {
		uris[i] = base + "/v0/entity?id=bench-" + strconv.Itoa(i) + "&ack=2&from=3"
	}
	return uris
}

// BenchmarkCoordinatorHTTP measures PUT and GET with ack=2&from=3 through
// node 0's public HTTP endpoint of an in-process 3-node cluster, with a
// fasthttp client. Allocations are the whole process's: client, the
// coordinator, and both peers serving the internal requests.
func BenchmarkCoordinatorHTTP(b *testing.B) {
	c := testcluster.Start(b, 3)
	client := &fasthttp.HostClient{Addr: c.Config(0).Listen, MaxConns: 64}
	defer client.CloseIdleConnections()
	uris := benchURIs(c.URL(0))
	do := func(b *testing.B, method string, body []byte, want int) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(method)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			req.SetRequestURI(uris[i%benchKeys])
			req.SetBody(body)
			if err := client.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			if resp.StatusCode() != want {
				b.Fatalf("%s: status %d", method, resp.StatusCode())
			}
			i++
		}
	}
	b.Run("PUT", func(b *testing.B) { do(b, fasthttp.MethodPut, benchValue, fasthttp.StatusCreated) })
	b.Run("GET", func(b *testing.B) { do(b, fasthttp.MethodGet, nil, fasthttp.StatusOK) })
}

// BenchmarkCoordinatorHandler calls the coordinator node's API handler
// directly with a fasthttp.RequestCtx, in a process that holds only that
// node: its two peers are the dhtkv binary in other processes. The
// allocations reported are therefore the coordinator's own per request
// (handler, coordinator fan-out, peer clients, local replica), without the
// peers' server side.
func BenchmarkCoordinatorHandler(b *testing.B) {
	pc := startProcCluster(b, 3, "--sync=false")
	// Replace process 0 by an in-process coordinator with the same URL.
	pc.kill(0)
	cfg := node.DefaultConfig()
	cfg.Listen = strings.TrimPrefix(pc.urls[0], "http://")
	cfg.Cluster = strings.Join(pc.urls, ",")
	cfg.DataDir = filepath.Join(b.TempDir(), "coord")
	cfg.Store.Sync = false
	cfg.ReplicaTimeout = time.Second
	testcluster.OnSharedDisk(&cfg)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.New(cfg) // built, not served: the handler is called directly
	require.NoError(b, err)
	defer n.Close()
	handler := n.Handler()

	uris := benchURIs("")
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 12345}
	run := func(b *testing.B, method string, body []byte, want int) {
		var req fasthttp.Request
		var ctx fasthttp.RequestCtx
		req.Header.SetMethod(method)
		req.SetBody(body)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			req.SetRequestURI(uris[i%benchKeys])
			ctx.Init(&req, addr, nil)
			handler(&ctx)
			if ctx.Response.StatusCode() != want {
				b.Fatalf("%s: status %d: %s", method, ctx.Response.StatusCode(), ctx.Response.Body())
			}
			i++
		}
	}
	b.Run("PUT", func(b *testing.B) { run(b, fasthttp.MethodPut, benchValue, fasthttp.StatusCreated) })
	b.Run("GET", func(b *testing.B) { run(b, fasthttp.MethodGet, nil, fasthttp.StatusOK) })
	// Baseline: the handler answering 400 without reaching the coordinator,
	// i.e. the cost of RequestCtx.Init and routing alone.
	b.Run("baseline-400", func(b *testing.B) {
		var req fasthttp.Request
		var ctx fasthttp.RequestCtx
		req.SetRequestURI("/v0/entity?id=k&ack=0")
		b.ReportAllocs()
		for b.Loop() {
			ctx.Init(&req, addr, nil)
			handler(&ctx)
		}
		if ctx.Response.StatusCode() != fasthttp.StatusBadRequest {
			b.Fatal(fmt.Sprint(ctx.Response.StatusCode()))
		}
	})
}
