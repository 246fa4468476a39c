package hlc

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStrictlyIncreasingWithFrozenClock(t *testing.T) {
	frozen := time.UnixMilli(1_700_000_000_000)
	c, err := New(3, func() time.Time { return frozen })
	require.NoError(t, err)
	prev := uint64(0)
	for i := 0; i < 10000; i++ { // more than 4096: overflows into the ms field
		v := next(t, c)
		require.Greater(t, v, prev)
		_, _, node := Parts(v)
		require.Equal(t, 3, node)
		prev = v
	}
}

func TestClockStepsBack(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	c, _ := New(0, func() time.Time { return now })
	a := next(t, c)
	now = now.Add(-time.Hour)
	require.Greater(t, next(t, c), a)
}

func TestSameMillisecondOrderedByNode(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	fixed := func() time.Time { return now }
	a, _ := New(1, fixed)
	b, _ := New(2, fixed)
	va, vb := next(t, a), next(t, b)
	require.NotEqual(t, va, vb)
	require.Greater(t, vb, va, "same ms and logical: the node id breaks the tie")
}

func TestObserveOrdersCausally(t *testing.T) {
	slow, _ := New(1, func() time.Time { return time.UnixMilli(1_000) })
	fast, _ := New(2, func() time.Time { return time.UnixMilli(1_400) }) // within DefaultMaxAhead
	v := next(t, fast)
	require.NoError(t, slow.Observe(v))
	require.Greater(t, next(t, slow), v, "a write after observing v is newer than v")
}

func TestConcurrentUnique(t *testing.T) {
	c, _ := New(7, nil)
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]uint64, 0, 1000)
			for i := 0; i < 1000; i++ {
				v, err := c.Next()
				if err != nil {
					panic(err)
				}
				local = append(local, v)
			}
			mu.Lock()
			for _, v := range local {
				require.False(t, seen[v])
				seen[v] = true
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
}

func TestNodeRange(t *testing.T) {
	_, err := New(256, nil)
	require.Error(t, err)
	_, err = New(-1, nil)
	require.Error(t, err)
}

func next(t *testing.T, c *Clock) uint64 {
	t.Helper()
	v, err := c.Next()
	require.NoError(t, err)
	return v
}

// A restored clock issues versions above everything issued or observed
// before the "restart", even when the wall clock is far behind them, and
// never uses a version above the bound persisted so far.
func TestRestoreSurvivesRestart(t *testing.T) {
	wall := time.UnixMilli(1_700_000_000_000)
	clockAt := func() time.Time { return wall }
	var persisted uint64
	persist := func(b uint64) error { persisted = b; return nil }

	c, _ := New(1, clockAt)
	c.Restore(0, persist)
	var highest uint64
	for i := 0; i < 100; i++ {
		v := next(t, c)
		require.LessOrEqual(t, v, persisted|MaxNodeID, "a version beyond the persisted bound")
		highest = v
	}
	future := uint64(wall.Add(DefaultMaxAhead/2).UnixMilli()) << (logicalBits + nodeBits)
	require.NoError(t, c.Observe(future))
	require.GreaterOrEqual(t, persisted, future, "observed versions are covered by the bound first")

	// Restart: a new clock, the wall clock even earlier than before.
	wall = wall.Add(-time.Minute)
	c2, _ := New(1, clockAt)
	c2.Restore(persisted, persist)
	v := next(t, c2)
	require.Greater(t, v, future)
	require.Greater(t, v, highest)
}

func TestPersistFailureStopsTheClock(t *testing.T) {
	c, _ := New(0, nil)
	c.Restore(0, func(uint64) error { return errors.New("disk full") })
	_, err := c.Next()
	require.ErrorContains(t, err, "disk full")
	ahead := uint64(time.Now().Add(DefaultMaxAhead/2).UnixMilli()) << (logicalBits + nodeBits)
	require.ErrorContains(t, c.Observe(ahead), "disk full")
}

// TestObserveRefusesFarFuture: a version more than DefaultMaxAhead ahead of the
// wall clock is refused and leaves the clock alone; one just inside is
// observed. The top of the 64-bit range would otherwise wrap the clock.
func TestObserveRefusesFarFuture(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	c, _ := New(1, func() time.Time { return now })
	before := next(t, c)
	for _, v := range []uint64{^uint64(0), uint64(now.Add(DefaultMaxAhead+time.Millisecond).UnixMilli()) << (logicalBits + nodeBits)} {
		require.ErrorIs(t, c.Observe(v), ErrTooFarAhead)
		require.ErrorIs(t, c.CheckAhead(v), ErrTooFarAhead)
	}
	after := next(t, c)
	require.Greater(t, after, before)
	ms, _, _ := Parts(after)
	require.Equal(t, now.UnixMilli(), ms, "the clock did not move to the refused versions")

	inside := uint64(now.Add(DefaultMaxAhead-time.Millisecond).UnixMilli()) << (logicalBits + nodeBits)
	require.NoError(t, c.Observe(inside))
	require.Greater(t, next(t, c), inside)
}

// TestRestartsDoNotPushTheClockAhead: a node restarted again and again,
// waiting out what Restore reports each time, issues versions that stay
// within PersistWindow of the wall clock, never accumulating.
func TestRestartsDoNotPushTheClockAhead(t *testing.T) {
	wall := time.UnixMilli(1_700_000_000_000)
	clockAt := func() time.Time { return wall }
	var persisted uint64
	persist := func(b uint64) error { persisted = b; return nil }
	var highest uint64
	for restart := range 200 {
		c, _ := New(1, clockAt)
		ahead := c.Restore(persisted, persist)
		require.LessOrEqual(t, ahead, PersistWindow, "restart %d", restart)
		wall = wall.Add(ahead) // the node waits it out
		for range 10 {
			v := next(t, c)
			require.Greater(t, v, highest, "restart %d: versions still increase", restart)
			highest = v
			ms, _, _ := Parts(v)
			require.LessOrEqual(t, ms-wall.UnixMilli(), int64(1), "restart %d: version ahead of the wall clock", restart)
		}
		wall = wall.Add(time.Millisecond) // a quick crash loop
	}
}

// TestRestoreReportsAnObservedBound: a bound far ahead because of a
// version observed from a fast clock is reported as it is; versions go on
// from it.
func TestRestoreReportsAnObservedBound(t *testing.T) {
	wall := time.UnixMilli(1_700_000_000_000)
	c, _ := New(1, func() time.Time { return wall })
	bound := uint64(wall.Add(3*time.Second).UnixMilli()) << (logicalBits + nodeBits)
	require.Equal(t, 3*time.Second, c.Restore(bound, func(uint64) error { return nil }))
	require.Greater(t, next(t, c), bound)
}

func TestSetMaxAhead(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	c, _ := New(1, func() time.Time { return now })
	v := uint64(now.Add(time.Minute).UnixMilli()) << (logicalBits + nodeBits)
	require.ErrorIs(t, c.CheckAhead(v), ErrTooFarAhead)
	c.SetMaxAhead(time.Hour)
	require.NoError(t, c.CheckAhead(v))
}

// TestRenewalDoesNotStopTheClock: while one caller writes the next bound,
// the others go on with versions within the bound already written, and
// only a version beyond it waits for the write.
func TestRenewalDoesNotStopTheClock(t *testing.T) {
	var ms atomic.Int64
	ms.Store(time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMilli())
	c, err := New(1, func() time.Time { return time.UnixMilli(ms.Load()) })
	require.NoError(t, err)
	var durable atomic.Uint64 // the bound written so far
	started, release := make(chan struct{}, 1), make(chan struct{})
	var hold atomic.Bool
	c.Restore(0, func(b uint64) error {
		if hold.Load() {
			started <- struct{}{}
			<-release
		}
		durable.Store(b)
		return nil
	})
	first, err := c.Next() // writes the first bound at once
	require.NoError(t, err)
	require.LessOrEqual(t, first, durable.Load()|MaxNodeID)

	// Past half the window: the next caller renews, and its write hangs.
	hold.Store(true)
	ms.Add(PersistWindow.Milliseconds() * 3 / 5)
	renewer := make(chan uint64)
	go func() {
		v, err := c.Next()
		assert.NoError(t, err)
		renewer <- v
	}()
	<-started
	old := durable.Load()
	others := make(chan struct{})
	go func() { // the others are not held up: within the old bound
		defer close(others)
		for range 100 {
			v, err := c.Next()
			assert.NoError(t, err)
			assert.LessOrEqual(t, v, old|MaxNodeID)
		}
		assert.NoError(t, c.Observe(old-5<<(logicalBits+nodeBits)))
	}()
	select {
	case <-others:
	case <-time.After(10 * time.Second):
		t.Fatal("callers within the bound waited for another's renewal")
	}

	// Beyond the old bound: waits for the write.
	ms.Add(PersistWindow.Milliseconds())
	beyond := make(chan uint64)
	go func() {
		v, err := c.Next()
		assert.NoError(t, err)
		assert.LessOrEqual(t, v, durable.Load()|MaxNodeID, "a version beyond the bound written")
		beyond <- v
	}()
	select {
	case v := <-beyond:
		t.Fatalf("version %d beyond the bound %d issued before the bound was written", v, old)
	case <-time.After(50 * time.Millisecond): // a negative: a bounded look
	}
	hold.Store(false)
	close(release)
	v1, v2 := <-renewer, <-beyond
	require.Greater(t, v2, old)
	require.NotEqual(t, v1, v2)
	st := c.Stats()
	require.GreaterOrEqual(t, st.Renewals, uint64(2), "the first bound and the renewal (the waiter may renew next)")
	require.Zero(t, st.Failed)
	require.EqualValues(t, 1, st.Waits, "only the version beyond the bound waited")
	require.Positive(t, st.WaitTime)
}

// TestVersionsStayWithinTheWrittenBound: under concurrent Next and Observe
// callers, writes of the bound that are sometimes slower than half a
// window and sometimes fail, and observed versions up to 300 ms ahead, no
// version is used before a bound covering it was written, and Next's
// versions are unique and increase for each caller.
func TestVersionsStayWithinTheWrittenBound(t *testing.T) {
	c, err := New(2, nil)
	require.NoError(t, err)
	var durable atomic.Uint64
	var writes atomic.Int64
	c.Restore(0, func(b uint64) error {
		switch n := writes.Add(1); {
		case n%7 == 0:
			return errors.New("disk full")
		case n%5 == 0:
			time.Sleep(60 * time.Millisecond) // slower than half a window
		default:
			time.Sleep(time.Duration(n%3) * time.Millisecond)
		}
		durable.Store(b)
		return nil
	})
	stop := time.Now().Add(500 * time.Millisecond)
	var issued sync.Map
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var last uint64
			for time.Now().Before(stop) {
				if g%2 == 0 {
					v, err := c.Next()
					if err != nil {
						assert.ErrorContains(t, err, "disk full")
						continue
					}
					assert.LessOrEqual(t, v, durable.Load()|MaxNodeID, "a version beyond the bound written")
					assert.Greater(t, v, last, "versions increase")
					_, dup := issued.LoadOrStore(v, g)
					assert.False(t, dup, "version %d issued twice", v)
					last = v
					continue
				}
				// A peer's version up to 300 ms ahead of the wall clock.
				ahead := time.Duration(rand.IntN(300)) * time.Millisecond
				v := uint64(time.Now().Add(ahead).UnixMilli()) << (logicalBits + nodeBits)
				if err := c.Observe(v); err != nil {
					assert.ErrorContains(t, err, "disk full")
					continue
				}
				assert.LessOrEqual(t, v, durable.Load()|MaxNodeID, "an observed version beyond the bound written")
			}
		})
	}
	wg.Wait()
}

// TestFailedRenewalKeepsVersionsUnique: the caller whose renewal fails
// while its version is still within the old bound gets a version after
// every one the others got meanwhile, never one of theirs again; and an
// Observe whose renewal fails does not take the clock back below a
// version observed meanwhile.
func TestFailedRenewalKeepsVersionsUnique(t *testing.T) {
	var ms atomic.Int64
	ms.Store(time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMilli())
	c, err := New(1, func() time.Time { return time.UnixMilli(ms.Load()) })
	require.NoError(t, err)
	started, release := make(chan struct{}, 1), make(chan struct{})
	var fail atomic.Bool
	c.Restore(0, func(uint64) error {
		if fail.Load() {
			started <- struct{}{}
			<-release
			return errors.New("disk failed")
		}
		return nil
	})
	_, err = c.Next() // the first bound, written
	require.NoError(t, err)

	fail.Store(true)
	ms.Add(PersistWindow.Milliseconds() * 3 / 5) // past half the window
	renewer := make(chan uint64)
	go func() {
		v, err := c.Next()
		assert.NoError(t, err, "within the old bound: usable though its renewal failed")
		renewer <- v
	}()
	<-started
	var others []uint64
	for range 3 {
		v, err := c.Next()
		require.NoError(t, err)
		others = append(others, v)
	}
	release <- struct{}{}
	v := <-renewer
	require.Greater(t, v, others[len(others)-1], "the renewer's version after the others'")

	// Observe: a renewal that fails while a larger version is observed.
	base := v &^ MaxNodeID
	small, big := base+2<<nodeBits, base+9<<nodeBits
	observed := make(chan error)
	go func() { observed <- c.Observe(small) }() // renews: past half the window
	<-started
	require.NoError(t, c.Observe(big)) // within the bound, not held up
	release <- struct{}{}
	require.NoError(t, <-observed)
	fail.Store(false)
	next, err := c.Next()
	require.NoError(t, err)
	require.Greater(t, next&^MaxNodeID, big, "the clock stays past the larger version observed")
	require.EqualValues(t, 2, c.Stats().Failed)
}

// TestSlowDiskDoesNotStallTheClock: with every write of the bound taking
// longer than a whole window, Next still returns after one renewal, not
// chasing a bound the wall clock has passed again, and its version lags
// the wall clock by about the disk's delay, not by the time since the
// last version (an hour here).
func TestSlowDiskDoesNotStallTheClock(t *testing.T) {
	var ms atomic.Int64
	ms.Store(time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMilli())
	c, err := New(1, func() time.Time { return time.UnixMilli(ms.Load()) })
	require.NoError(t, err)
	slow := 3 * PersistWindow / 2
	var writes atomic.Int64 // this call's
	c.Restore(0, func(uint64) error {
		if writes.Add(1) > 3 {
			return errors.New("the bound written over and over for one call")
		}
		ms.Add(slow.Milliseconds())
		return nil
	})
	var last uint64
	for i := range 20 {
		if i == 10 {
			ms.Add(time.Hour.Milliseconds()) // a pause
		}
		writes.Store(0)
		v, err := c.Next()
		require.NoError(t, err, "call %d", i)
		require.Greater(t, v, last)
		last = v
		require.LessOrEqual(t, writes.Load(), int64(1), "call %d wrote the bound more than once", i)
		made, _, _ := Parts(v)
		require.Less(t, ms.Load()-int64(made), (2 * slow).Milliseconds(), "call %d: lag behind the wall clock", i)
	}
}
