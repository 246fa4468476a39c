package httpapi

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// A request whose handler panics (a bug: here a server without a
// coordinator) is answered 500 and its connection closed, the panic
// logged with its stack; fasthttp recovers nothing, so the panic ended
// the node, and a client retrying the request through every node would
// end them all in turn.
func TestHandlerPanicAnswers500(t *testing.T) {
	var logs bytes.Buffer
	s := &Server{Metrics: NewMetrics(nil), Log: slog.New(slog.NewTextHandler(&logs, nil))}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(fasthttp.MethodGet)
	ctx.Request.SetRequestURI("/v0/entity?id=k")
	require.NotPanics(t, func() { s.Handler(&ctx) })
	require.Equal(t, fasthttp.StatusInternalServerError, ctx.Response.StatusCode())
	require.Contains(t, string(ctx.Response.Body()), "internal error: this node hit a bug serving the request (logged)")
	require.True(t, ctx.Response.ConnectionClose())
	require.Contains(t, logs.String(), "request handler panicked")
	require.Contains(t, logs.String(), "recoverPanic", "the stack is logged")
}
