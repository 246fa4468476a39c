package rpc

import (
	"errors"
	"io"
	"log/slog"
	"net"
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

// A batch that reaches a node more than lateGrace after its sender's
// deadline (DeadlineHeader, on the receiver's clock as last measured) is
// answered 504 and applied nowhere; its caller gets a timeout. The
// receiver's clock stands in for a paused node's: stepped 5 s ahead, the
// node finds the batch sent 5 s ago with a second to live. Before any
// measurement no deadline is sent, and the 504 carries the node's time,
// so the sender's next batch, with the new offset, is served.
func TestLateBatch(t *testing.T) {
	var step atomic.Int64 // the receiver's clock, ahead of time.Now by this
	clock, err := hlc.New(1, func() time.Time { return time.Now().Add(time.Duration(step.Load())) })
	require.NoError(t, err)
	st, err := store.Open("/db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	defer st.Close()
	late := prometheus.NewCounter(prometheus.CounterOpts{Name: "late"})
	srv := &Server{Replica: &replica.Replica{Store: st, Clock: clock}, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20,
		Late: late, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ln := fasthttputil.NewInmemoryListener()
	served := make(chan error, 1)
	go func() {
		served <- fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) { srv.HandleBatch(ctx, ctx.PostBody()) })
	}()
	defer func() { require.NoError(t, ln.Close()); <-served }()
	p := NewPeer("http://127.0.0.1:1", PeerOptions{Timeout: time.Second, Conns: 1,
		Dial: func(string, time.Duration) (net.Conn, error) { return ln.Dial() }}, nil)
	defer p.Close()

	put := func(key string) error {
		v, err := clock.Next()
		require.NoError(t, err)
		_, err = p.Apply([]byte(key), (&record.Record{Version: v, Value: []byte("v")}).Encode(), 0, time.Now().Add(time.Second))
		return err
	}
	stored := func(key string) bool {
		_, found, err := st.Version([]byte(key))
		require.NoError(t, err)
		return found
	}

	step.Store(int64(10 * time.Second)) // no measurement yet: no deadline sent, served
	require.NoError(t, put("first"))
	require.True(t, stored("first"))
	s, ok := p.ClockOffset()
	require.True(t, ok)
	require.InDelta(t, 10*time.Second, s.Offset, float64(100*time.Millisecond), "measured off the answer")

	step.Store(int64(15 * time.Second)) // 5 s more: the batch arrives 4 s after its deadline
	err = put("late")
	require.ErrorIs(t, err, ErrTimeout)
	require.False(t, stored("late"), "a late batch is applied nowhere")
	require.Equal(t, 1.0, testutil.ToFloat64(late))
	s, _ = p.ClockOffset()
	require.InDelta(t, 15*time.Second, s.Offset, float64(100*time.Millisecond), "the 504 carried the node's time")

	require.NoError(t, put("again"), "with the new offset the next batch is on time")
	require.True(t, stored("again"))
	step.Store(int64(15*time.Second + 1500*time.Millisecond)) // within the deadline and its grace
	require.NoError(t, put("within"))
	require.True(t, stored("within"))
	require.Equal(t, 1.0, testutil.ToFloat64(late))

	for _, h := range []string{"", "x", "-"} {
		require.False(t, srv.late([]byte(h)), "header %q: served as before", h)
	}
	require.False(t, errors.Is(put("last"), ErrTimeout))
}
