package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// newBenchServer builds a single node the way the binary does (node.New),
// without a listener, and returns its handler: benchmarks measure our code
// and fasthttp's request handling but no sockets.
func newBenchServer(b testing.TB, sync bool, cacheBytes int64, opts ...func(*node.Config)) fasthttp.RequestHandler {
	cfg := node.DefaultConfig()
	cfg.DataDir = b.TempDir()
	cfg.Store.Sync = sync
	cfg.CacheBytes = cacheBytes
	cfg.MaxValueBytes = 1 << 20
	testcluster.OnSharedDisk(&cfg)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, o := range opts {
		o(&cfg)
	}
	n, err := node.New(cfg)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, n.Close()) })
	return n.Handler()
}

// do runs one request through the handler, reusing ctx like fasthttp does
// for a keep-alive connection.
func do(s fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, method string, uri, body []byte) int {
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURIBytes(uri)
	if body != nil {
		ctx.Request.SetBodyRaw(body)
	}
	s(ctx)
	return ctx.Response.StatusCode()
}

func newCtx() *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	ctx.Init(&req, nil, nil)
	return &ctx
}

const nKeys = 10000

func uris(prefix string) [][]byte {
	u := make([][]byte, nKeys)
	for i := range u {
		u[i] = []byte(fmt.Sprintf("/v0/entity?id=%s%d", prefix, i))
	}
	return u
}

func fill(b *testing.B, s fasthttp.RequestHandler, u [][]byte, val []byte) {
	ctx := newCtx()
	for _, x := range u {
		require.Equal(b, 201, do(s, ctx, "PUT", x, val))
	}
}

// BenchmarkGetHit: every GET is served by the read cache. Target: at most 1
// allocation per request in our code.
func BenchmarkGetHit(b *testing.B) {
	s := newBenchServer(b, false, 64<<20)
	u := uris("k")
	fill(b, s, u, make([]byte, 1024))
	ctx := newCtx()
	for _, x := range u { // warm the cache
		do(s, ctx, "GET", x, nil)
	}
	b.ReportAllocs()
	b.SetBytes(1024)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if do(s, ctx, "GET", u[i%nKeys], nil) != 200 {
			b.Fatal("not 200")
		}
	}
}

// BenchmarkGetHitAccessLog is BenchmarkGetHit with the access log
// (--access-log-sample) off, sampling 1 in 100, and logging every request
// as JSON (to io.Discard: the cost of making the line, not of the disk).
// Off, the request path pays one comparison and allocates nothing.
func BenchmarkGetHitAccessLog(b *testing.B) {
	for _, tc := range []struct {
		name   string
		sample float64
	}{{"off", 0}, {"sample=0.01", 0.01}, {"sample=1", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			s := newBenchServer(b, false, 64<<20, func(cfg *node.Config) {
				cfg.AccessLog.Sample = tc.sample
				cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
			})
			u := uris("k")
			fill(b, s, u, make([]byte, 1024))
			ctx := newCtx()
			for _, x := range u { // warm the cache
				do(s, ctx, "GET", x, nil)
			}
			b.ReportAllocs()
			b.SetBytes(1024)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if do(s, ctx, "GET", u[i%nKeys], nil) != 200 {
					b.Fatal("not 200")
				}
			}
		})
	}
}

// cpuClock reports, as cpu-ns/op, the process's CPU time (user and system,
// every goroutine: ristretto's policy goroutine and Pebble's background
// work too) per operation from the call to the end of the benchmark. On
// two cores the wall-clock ns/op hides work done on the other core.
func cpuClock(b *testing.B) {
	var ru0 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		var ru1 syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru1); err != nil || b.N == 0 {
			return
		}
		used := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
		b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}

// BenchmarkGetHitLarge: cache hits over 100k keys of 1 KiB in random order,
// the shape of the load runs (about 110 MiB of entries, far more than the
// CPU caches hold), so it measures the memory accesses of a hit as well.
// The parallel variant adds what two cores contend for.
func BenchmarkGetHitLarge(b *testing.B) {
	const n = 100_000
	s := newBenchServer(b, false, 256<<20)
	u := make([][]byte, n)
	for i := range u {
		u[i] = []byte(fmt.Sprintf("/v0/entity?id=k%d", i))
	}
	fill(b, s, u, make([]byte, 1024))
	ctx := newCtx()
	for _, x := range u { // warm the cache
		do(s, ctx, "GET", x, nil)
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	b.Run("serial", func(b *testing.B) {
		cpuClock(b)
		b.ReportAllocs()
		b.SetBytes(1024)
		for i := 0; b.Loop(); i++ {
			if do(s, ctx, "GET", u[order[i%n]], nil) != 200 {
				b.Fatal("not 200")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		cpuClock(b)
		b.ReportAllocs()
		b.SetBytes(1024)
		var next atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			ctx := newCtx()
			for i := int(next.Add(n / 2)); pb.Next(); i++ {
				if do(s, ctx, "GET", u[order[i%n]], nil) != 200 {
					b.Fatal("not 200")
				}
			}
		})
	})
}

// BenchmarkGetMiss: the cache is off, every GET reads Pebble (memtable and
// block cache: the data set is small).
func BenchmarkGetMiss(b *testing.B) {
	s := newBenchServer(b, false, 0)
	u := uris("k")
	fill(b, s, u, make([]byte, 1024))
	ctx := newCtx()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if do(s, ctx, "GET", u[i%nKeys], nil) != 200 {
			b.Fatal("not 200")
		}
	}
}

// BenchmarkGetAbsent: GETs of keys never written, with the cache on (the
// negative entries are cached after the first miss).
func BenchmarkGetAbsent(b *testing.B) {
	s := newBenchServer(b, false, 64<<20)
	u := uris("absent")
	ctx := newCtx()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if do(s, ctx, "GET", u[i%nKeys], nil) != 404 {
			b.Fatal("not 404")
		}
	}
}

func benchPut(b *testing.B, sync bool) {
	s := newBenchServer(b, sync, 64<<20)
	u := uris("k")
	val := make([]byte, 1024)
	ctx := newCtx()
	b.ReportAllocs()
	b.SetBytes(1024)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if do(s, ctx, "PUT", u[i%nKeys], val) != 201 {
			b.Fatal("not 201")
		}
	}
}

// BenchmarkPut: --sync=false (the WAL is written, not fsynced).
func BenchmarkPut(b *testing.B) { benchPut(b, false) }

// BenchmarkPutSync: the default --sync=true, one writer: every request pays
// a full fsync (concurrent writers share them; see docs/benchmarks.md).
func BenchmarkPutSync(b *testing.B) { benchPut(b, true) }

func BenchmarkDelete(b *testing.B) {
	s := newBenchServer(b, false, 64<<20)
	u := uris("k")
	ctx := newCtx()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if do(s, ctx, "DELETE", u[i%nKeys], nil) != 202 {
			b.Fatal("not 202")
		}
	}
}

// BenchmarkHeaderReceived is the check every request's headers get before
// its body is read (framing.go): one pass over the raw header block.
func BenchmarkHeaderReceived(b *testing.B) {
	s := &httpapi.Server{Limits: httpapi.Limits{MaxKeyBytes: 1024, MaxValueBytes: 1 << 20}}
	const req = "PUT /v0/entity?id=k1&ack=2&from=3 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: dhtkv-load\r\n" +
		"Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n\r\n"
	var h fasthttp.RequestHeader
	require.NoError(b, h.Read(bufio.NewReader(strings.NewReader(req))))
	b.ReportAllocs()
	for b.Loop() {
		if cfg := s.HeaderReceived(&h); cfg.MaxRequestBodySize != 0 {
			b.Fatal("changed a limit")
		}
	}
}
