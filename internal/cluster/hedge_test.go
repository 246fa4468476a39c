package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLatencyWindowQuantile(t *testing.T) {
	now := time.Now()
	var w latencyWindow
	for i := 1; i < readWindow; i++ {
		w.record(time.Duration(i)*time.Millisecond, now)
	}
	_, ok := w.quantile(now)
	require.False(t, ok, "no quantile before the window is full")
	w.record(readWindow*time.Millisecond, now) // samples are 1..256 ms
	q, ok := w.quantile(now)
	require.True(t, ok)
	require.Equal(t, time.Duration(hedgeRank+1)*time.Millisecond, q, "the 95th percentile")

	// The ring keeps the newest readWindow samples only.
	for range readWindow {
		w.record(3*time.Millisecond, now)
	}
	q, ok = w.quantile(now)
	require.True(t, ok)
	require.Equal(t, 3*time.Millisecond, q)

	_, ok = w.quantile(now.Add(readWindowTTL + time.Millisecond))
	require.False(t, ok, "a quantile older than readWindowTTL is not used")
}

func TestReadHedgeDelay(t *testing.T) {
	now := time.Now()
	window := func(d time.Duration, at time.Time) *latencyWindow {
		w := new(latencyWindow)
		for range readWindow {
			w.record(d, at)
		}
		return w
	}
	stale := now.Add(-2 * readWindowTTL)
	for _, tc := range []struct {
		name  string
		peers []*latencyWindow
		want  time.Duration
	}{
		{"no samples: the floor", []*latencyWindow{nil, new(latencyWindow), new(latencyWindow)}, 5 * time.Millisecond},
		{"fast peers: the floor", []*latencyWindow{nil, window(time.Millisecond, now), window(2*time.Millisecond, now)}, 5 * time.Millisecond},
		{"all slow: the fastest peer's", []*latencyWindow{nil, window(20*time.Millisecond, now), window(50*time.Millisecond, now)}, 20 * time.Millisecond},
		{"one slow: the fast one's", []*latencyWindow{nil, window(time.Second, now), window(7*time.Millisecond, now)}, 7 * time.Millisecond},
		{"stale windows do not count", []*latencyWindow{nil, window(time.Millisecond, stale), window(30*time.Millisecond, now)}, 30 * time.Millisecond},
		{"at most half the replica timeout", []*latencyWindow{nil, window(time.Second, now)}, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers := make([]*peer, len(tc.peers))
			for i, w := range tc.peers {
				if w != nil {
					peers[i] = &peer{readLat: w}
				}
			}
			c := &Coordinator{hedgeDelay: 5 * time.Millisecond, timeout: 400 * time.Millisecond}
			require.Equal(t, tc.want, c.readHedgeDelayOf(&routes{peers: peers}, now))
		})
	}
}
