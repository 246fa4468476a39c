package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Stop cancels every goroutine and returns only once all have returned;
// nothing runs after it.
func TestGroupStopWaits(t *testing.T) {
	g := New()
	var ran, ended atomic.Int32
	started := make(chan struct{})
	g.Go(func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		ended.Add(1)
	})
	g.Every(time.Millisecond, func(context.Context) { ran.Add(1) })
	<-started
	g.Stop()
	require.Equal(t, int32(1), ended.Load(), "Stop waited for the goroutine")
	require.Positive(t, ran.Load(), "Every runs at once")
	n := ran.Load()
	g.Go(func(context.Context) { ran.Add(100) })
	g.Stop()
	require.Equal(t, n, ran.Load(), "nothing runs after Stop")
	require.True(t, g.Stopping())
	require.False(t, g.Sleep(time.Hour), "Sleep returns at Stop")
}

// Tick waits an interval before its first run.
func TestGroupTick(t *testing.T) {
	g := New()
	defer g.Stop()
	done := make(chan struct{})
	var once atomic.Bool
	start := time.Now()
	g.Tick(20*time.Millisecond, func(context.Context) {
		if once.CompareAndSwap(false, true) {
			close(done)
		}
	})
	<-done
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}
