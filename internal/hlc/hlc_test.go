package hlc

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStrictlyIncreasingWithFrozenClock(t *testing.T) {
	frozen := time.UnixMilli(1_700_000_000_000)
	c, err := New(3, func() time.Time { return frozen })
	require.NoError(t, err)
	prev := uint64(0)
	for i := 0; i < 10000; i++ { // more than 4096: overflows into the ms field
		v := c.Next()
		require.Greater(t, v, prev)
		_, _, node := Parts(v)
		require.Equal(t, 3, node)
		prev = v
	}
}

func TestClockStepsBack(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	c, _ := New(0, func() time.Time { return now })
	a := c.Next()
	now = now.Add(-time.Hour)
	require.Greater(t, c.Next(), a)
}

func TestSameMillisecondOrderedByNode(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	fixed := func() time.Time { return now }
	a, _ := New(1, fixed)
	b, _ := New(2, fixed)
	va, vb := a.Next(), b.Next()
	require.NotEqual(t, va, vb)
	require.Greater(t, vb, va, "same ms and logical: the node id breaks the tie")
}

func TestObserveOrdersCausally(t *testing.T) {
	slow, _ := New(1, func() time.Time { return time.UnixMilli(1_000) })
	fast, _ := New(2, func() time.Time { return time.UnixMilli(9_000) })
	v := fast.Next()
	slow.Observe(v)
	require.Greater(t, slow.Next(), v, "a write after observing v is newer than v")
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
				local = append(local, c.Next())
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
