package httpapi_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

const benchToken = "write-token-0123456789abcdef"

// newAuthBenchServer is newBenchServer with client tokens on or off: the
// file holds tokens of every role, the write one last.
func newAuthBenchServer(tb testing.TB, auth bool) fasthttp.RequestHandler {
	cfg := node.DefaultConfig()
	cfg.DataDir = filepath.Join(tb.TempDir(), "data")
	cfg.Store.Sync = false
	testcluster.OnSharedDisk(&cfg)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if auth {
		cfg.ClientTokens = filepath.Join(tb.TempDir(), "tokens")
		require.NoError(tb, os.WriteFile(cfg.ClientTokens, []byte("read read-token-0123456789abcdef\nadmin admin-token-0123456789abcdef\nwrite "+benchToken+"\n"), 0o600))
	}
	n, err := node.New(cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, n.Close()) })
	return n.Handler()
}

// doAuth is do with the write token in the Authorization header.
func doAuth(s fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, method string, uri, body []byte) int {
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURIBytes(uri)
	ctx.Request.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+benchToken)
	if body != nil {
		ctx.Request.SetBodyRaw(body)
	}
	s(ctx)
	return ctx.Response.StatusCode()
}

// BenchmarkAuth: what client authentication adds to a request's path, on
// the cheapest request there is (a GET the read cache answers) and a PUT:
// the same requests with tokens off and on (the token sent and checked).
func BenchmarkAuth(b *testing.B) {
	for _, auth := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[auth]
		s := newAuthBenchServer(b, auth)
		u := uris("k")
		val := make([]byte, 1024)
		ctx := newCtx()
		for _, x := range u {
			require.Equal(b, 201, doAuth(s, ctx, "PUT", x, val))
			require.Equal(b, 200, doAuth(s, ctx, "GET", x, nil)) // warm the cache
		}
		b.Run("get-hit/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if doAuth(s, ctx, "GET", u[i%nKeys], nil) != 200 {
					b.Fatal("not 200")
				}
			}
		})
		b.Run("put/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if doAuth(s, ctx, "PUT", u[i%nKeys], val) != 201 {
					b.Fatal("not 201")
				}
			}
		})
	}
}

// TestAuthAddsNoAllocation: a request with client tokens on allocates no
// more than the same request with them off.
func TestAuthAddsNoAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	allocs := map[bool]float64{}
	for _, auth := range []bool{false, true} {
		s := newAuthBenchServer(t, auth)
		uri := []byte("/v0/entity?id=k")
		ctx := newCtx()
		require.Equal(t, 201, doAuth(s, ctx, "PUT", uri, []byte("v")))
		require.Equal(t, 200, doAuth(s, ctx, "GET", uri, nil))
		allocs[auth] = testing.AllocsPerRun(200, func() {
			if doAuth(s, ctx, "GET", uri, nil) != 200 {
				t.Fatal("not 200")
			}
		})
	}
	t.Logf("allocations per GET: tokens on %v, off %v", allocs[true], allocs[false])
	require.LessOrEqual(t, allocs[true], allocs[false], "allocations per GET: tokens on %v, off %v", allocs[true], allocs[false])
}
