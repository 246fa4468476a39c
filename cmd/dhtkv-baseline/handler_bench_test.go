package main

import (
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkHandler measures the baseline's handler without sockets: what
// the reference server spends per request on top of fasthttp's parsing.
// The request context is reused across iterations, as fasthttp reuses it
// on a keep-alive connection.
func BenchmarkHandler(b *testing.B) {
	const keys = 4096
	value := make([]byte, 1024)
	paths := make([][]byte, keys)
	for i := range paths {
		paths[i] = []byte("/v0/entity?id=k" + strconv.Itoa(i))
	}
	filled := func() *api {
		a := &api{data: newMemStore()}
		for _, p := range paths {
			a.data.store(p[len("/v0/entity?id="):], value)
		}
		return a
	}

	for _, bc := range []struct {
		name   string
		method string
		body   []byte
		status int
	}{
		{"get", fasthttp.MethodGet, nil, fasthttp.StatusOK},
		{"put", fasthttp.MethodPut, value, fasthttp.StatusCreated},
		{"delete", fasthttp.MethodDelete, nil, fasthttp.StatusAccepted},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a := filled()
			var ctx fasthttp.RequestCtx
			ctx.Init(&fasthttp.Request{}, nil, nil)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ctx.Request.Reset()
				ctx.Response.Reset()
				ctx.Request.Header.SetMethod(bc.method)
				ctx.Request.SetRequestURIBytes(paths[i%keys])
				ctx.Request.SetBodyRaw(bc.body)
				a.handle(&ctx)
				if got := ctx.Response.StatusCode(); got != bc.status {
					b.Fatalf("%s %s: status %d, want %d", bc.method, paths[i%keys], got, bc.status)
				}
				i++
			}
		})
	}
}
