package rpc

import (
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// A batch carries its deadline on the receiver's clock, reckoned from the
// receiver's last answer on the sender's monotonic clock: none before
// any answer, and a step of the sender's wall clock changes nothing. A
// step of the receiver's clock makes a timely batch look late: its 504
// carries the receiver's time, and the sender, still waiting, sends it
// once more, on time.
func TestLateBatchClocks(t *testing.T) {
	srv, st, late, step := lateServer(t)
	var senderStep atomic.Int64 // the sender's wall clock, off by this
	ln := fasthttputil.NewInmemoryListener()
	served := make(chan error, 1)
	go func() {
		served <- fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) { srv.HandleBatch(ctx, ctx.PostBody()) })
	}()
	defer func() { require.NoError(t, ln.Close()); <-served }()
	p := NewPeer("http://127.0.0.1:1", PeerOptions{Timeout: 2 * time.Second, Conns: 1,
		Now:  func() time.Time { return time.Now().Add(time.Duration(senderStep.Load())) },
		Dial: func(string, time.Duration) (net.Conn, error) { return ln.Dial() }}, nil)
	defer p.Close()
	put := func(key string) {
		t.Helper()
		v, err := srv.Replica.Clock.Next()
		require.NoError(t, err)
		_, err = p.Apply([]byte(key), (&record.Record{Version: v, Value: []byte("v")}).Encode(), 0, time.Now().Add(2*time.Second))
		require.NoError(t, err, key)
		_, found, err := st.Version([]byte(key))
		require.NoError(t, err)
		require.True(t, found, key)
	}

	step.Store(int64(10 * time.Second)) // nothing read yet: no deadline sent
	put("first")
	_, read := p.lastPeerTime()
	require.True(t, read, "the answer's time is read")

	senderStep.Store(int64(-30 * time.Second)) // the sender's wall clock steps back
	put("sender stepped")
	require.Zero(t, testutil.ToFloat64(late), "the deadline does not follow the sender's wall clock")

	step.Store(int64(15 * time.Second)) // the receiver's steps 5 s ahead
	put("receiver stepped")
	require.Equal(t, 1.0, testutil.ToFloat64(late), "found late once")
	put("after")
	require.Equal(t, 1.0, testutil.ToFloat64(late), "then on time, from the 504's reading")
}

// A batch that arrives more than lateGrace after its DeadlineHeader is
// answered 504, with this node's time, and nothing of it is applied; a
// ping (an empty batch), a batch within the grace and one with a
// malformed header are served as ever.
func TestLateBatchRefused(t *testing.T) {
	srv, st, late, _ := lateServer(t)
	handle := func(key string, deadline string) *fasthttp.Response {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.Set(DeadlineHeader, deadline)
		var body []byte
		if key != "" {
			v, err := srv.Replica.Clock.Next()
			require.NoError(t, err)
			body = AppendBatchOp(nil, OpWrite, []byte(key), (&record.Record{Version: v, Value: []byte("v")}).Encode())
		}
		srv.HandleBatch(&ctx, body)
		return &ctx.Response
	}
	stored := func(key string) bool {
		_, found, err := st.Version([]byte(key))
		require.NoError(t, err)
		return found
	}
	at := func(d time.Duration) string {
		return strconv.FormatInt(srv.Replica.Clock.Wall().Add(d).UnixMicro(), 10)
	}

	r := handle("late", at(-lateGrace-100*time.Millisecond))
	require.Equal(t, fasthttp.StatusGatewayTimeout, r.StatusCode())
	require.NotEmpty(t, r.Header.Peek(TimeHeader), "with this node's time")
	require.False(t, stored("late"), "nothing applied")
	require.Equal(t, 1.0, testutil.ToFloat64(late))

	require.Equal(t, fasthttp.StatusOK, handle("", at(-time.Hour)).StatusCode(), "a ping")
	require.Equal(t, fasthttp.StatusOK, handle("within", at(-lateGrace+100*time.Millisecond)).StatusCode())
	require.True(t, stored("within"))
	for _, h := range []string{"x", "-", ""} {
		require.Equal(t, fasthttp.StatusOK, handle("malformed"+h, h).StatusCode(), "header %q", h)
		require.True(t, stored("malformed"+h))
	}
	require.Equal(t, 1.0, testutil.ToFloat64(late))
}

// lateServer is a batch server on real Pebble (in memory) whose clock is
// ahead of time.Now by step, and the counter of its late batches.
func lateServer(t *testing.T) (*Server, *store.Store, prometheus.Counter, *atomic.Int64) {
	t.Helper()
	step := new(atomic.Int64)
	clock, err := hlc.New(1, func() time.Time { return time.Now().Add(time.Duration(step.Load())) })
	require.NoError(t, err)
	st, err := store.Open("/db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	late := prometheus.NewCounter(prometheus.CounterOpts{Name: "late"})
	return &Server{Replica: &replica.Replica{Store: st, Clock: clock}, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20,
		Late: late, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, st, late, step
}
