package hlc

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestVersionNotBelowTheCallersWallClock: a version is at least the
// wall clock's reading when Next was called (docs/replication.md, rule 3:
// "W2's coordinator's clock is past W1's version, and W2's version, at
// least that clock, is higher"). Caller A renews the bound after a pause
// and the fsync takes 150 ms (more than PersistWindow); caller B calls
// Next 150 ms after A, while the renewal is under way. B waits for it and
// then got the bound written less a window, which is A's start time:
// 150 ms below the wall clock at which B began.
func TestVersionNotBelowTheCallersWallClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ms atomic.Int64
		ms.Store(time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMilli())
		c, err := New(1, func() time.Time { return time.UnixMilli(ms.Load()) })
		require.NoError(t, err)
		release := make(chan struct{})
		var calls atomic.Int64
		c.Restore(0, func(uint64) error {
			if calls.Add(1) == 1 {
				<-release // the first renewal's fsync is slow
			}
			return nil
		})
		type res struct {
			v     uint64
			begun int64
		}
		out := make(chan res, 2)
		call := func() {
			begun := ms.Load()
			v, err := c.Next()
			require.NoError(t, err)
			out <- res{v, begun}
		}
		go call() // A: renews, blocked in the fsync
		synctest.Wait()
		ms.Add(150) // the fsync has taken 150 ms so far
		go call()   // B: beyond the old bound, waits for A's renewal
		synctest.Wait()
		close(release)
		for range 2 {
			r := <-out
			made, _, _ := Parts(r.v)
			require.GreaterOrEqual(t, made, r.begun,
				"version's time %d ms is %d ms before the wall clock when its Next began", made, r.begun-made)
		}
	})
}
