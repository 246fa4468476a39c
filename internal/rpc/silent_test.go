package rpc

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// A peer that leaves a batch unanswered for half the timeout turns
// silent: its calls then fail at once without a request, one ping at a
// time asks whether it answers again, and the first answer ends the
// silence. A batch that times out with less than half the timeout to
// answer says nothing of the peer, nor does a background read's.
func TestSilentPeer(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { // last: after the store's and the server's ends
		// fasthttp's own sleepers end with their sleeps: only the prober
		// and the senders are this test's to check.
		goleak.VerifyNone(t, ignore,
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
	})
	const timeout = time.Second // generous: a trip needs the timeout's answer back within a quarter of it
	srv, _, _, _ := lateServer(t)
	var (
		received atomic.Int64 // requests the peer read, pings included
		mu       sync.Mutex
		thaw     chan struct{} // non-nil while the peer is frozen
	)
	frozen := func() chan struct{} { mu.Lock(); defer mu.Unlock(); return thaw }
	ln := fasthttputil.NewInmemoryListener()
	served := make(chan error, 1)
	var handlers sync.WaitGroup // fasthttp.Serve returns without waiting for them
	go func() {
		served <- fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) {
			handlers.Add(1)
			defer handlers.Done()
			received.Add(1)
			if c := frozen(); c != nil {
				<-c
			}
			srv.HandleBatch(ctx, ctx.PostBody())
		})
	}()
	// After the peer's Close (deferred below, so run first): a handler
	// thawed at the end must be done with the store before its cleanup
	// closes it.
	defer func() { require.NoError(t, ln.Close()); <-served; handlers.Wait() }()
	reg := prometheus.NewRegistry()
	p := NewPeer("http://127.0.0.1:1", PeerOptions{Timeout: timeout, Conns: 1,
		Dial: func(string, time.Duration) (net.Conn, error) { return ln.Dial() }}, NewMetrics(reg))
	defer p.Close()
	put := func(key string, deadline time.Time) error {
		v, err := srv.Replica.Clock.Next()
		require.NoError(t, err)
		_, err = p.Apply([]byte(key), (&record.Record{Version: v, Value: []byte("v")}).Encode(), 0, deadline)
		return err
	}
	gauge := func() float64 { return testutil.ToFloat64(p.silence.gauge) }

	require.NoError(t, put("before", time.Now().Add(timeout)))
	mu.Lock()
	thaw = make(chan struct{})
	mu.Unlock()

	// A batch with a tenth of the timeout left is not the peer's fault.
	require.ErrorIs(t, put("short", time.Now().Add(timeout/10)), ErrTimeout)
	require.Zero(t, gauge(), "not silent after a batch given a tenth of the timeout")
	// Nor is a background read's, whose answer may be large.
	done := make(chan *view.Call, 1)
	p.Go(&view.Call{Key: []byte("before"), Deadline: time.Now().Add(timeout), Background: true, Done: done})
	require.ErrorIs(t, (<-done).Err, ErrTimeout)
	require.Zero(t, gauge(), "not silent after a background read unanswered for the whole timeout")

	start := time.Now()
	require.ErrorIs(t, put("stuck", start.Add(timeout)), ErrTimeout)
	require.Equal(t, 1.0, gauge(), "silent after a batch unanswered for the whole timeout")
	require.Equal(t, 1.0, testutil.ToFloat64(p.silence.silences))

	before, failStart := received.Load(), time.Now()
	const calls = 50
	for i := range calls {
		err := put(fmt.Sprint("fast-", i), time.Now().Add(timeout))
		require.ErrorIs(t, err, ErrSilent)
		require.ErrorIs(t, err, ErrTimeout, "a silent peer's call is a timeout to its caller")
		require.ErrorContains(t, err, "calls fail at once")
	}
	// Each call failed at once; only the prober's pings reached the peer,
	// one at a time, at most one a timeout.
	pings := received.Load() - before
	require.LessOrEqual(t, pings, int64(time.Since(failStart)/timeout)+2, "only pings reached the silent peer")
	require.Equal(t, float64(calls), testutil.ToFloat64(p.silence.failedFast))

	mu.Lock()
	close(thaw)
	thaw = nil
	mu.Unlock()
	require.Eventually(t, func() bool { return p.silence.since.Load() == nil }, 10*time.Second, 10*time.Millisecond, "the first answer to a ping ends the silence")
	require.Zero(t, gauge())
	require.NoError(t, put("after", time.Now().Add(timeout)))
	require.Equal(t, float64(calls), testutil.ToFloat64(p.silence.failedFast), "nothing failed fast once it answered")

	// Silent again, and then nobody calls (a member that left): the
	// silence ends unanswered after silentIdle rounds, and the pings stop.
	mu.Lock()
	thaw = make(chan struct{})
	mu.Unlock()
	require.ErrorIs(t, put("stuck-again", time.Now().Add(timeout)), ErrTimeout)
	require.Equal(t, 1.0, gauge())
	require.Eventually(t, func() bool { return p.silence.since.Load() == nil }, (silentIdle+3)*timeout, 10*time.Millisecond,
		"a silence no call asks about ends")
	require.Zero(t, gauge())
	require.Equal(t, 2.0, testutil.ToFloat64(p.silence.silences))
	// Ended unanswered (the peer is still frozen), and no prober is left
	// to ping it.
	pinged := received.Load()
	require.Never(t, func() bool { return received.Load() != pinged }, timeout*3/2, 50*time.Millisecond,
		"the peer is still pinged after its silence ended")
	mu.Lock()
	close(thaw)
	thaw = nil
	mu.Unlock()
}
