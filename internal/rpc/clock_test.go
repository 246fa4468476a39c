package rpc

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClockOffset: a measurement is the peer's time minus the exchange's
// midpoint, with half the round trip as its error, offset and error read
// back as one pair; an exchange whose round trip went backwards (this
// clock stepped) or lasted over two seconds is not kept.
func TestClockOffset(t *testing.T) {
	var o clockOffset
	_, ok := o.get()
	require.False(t, ok, "nothing measured yet")

	sent := time.UnixMilli(1_800_000_000_000)
	for _, tc := range []struct {
		peer       time.Duration // the peer's reading, from sent
		rtt        time.Duration
		off, error time.Duration
	}{
		{peer: 30*time.Second + 5*time.Millisecond, rtt: 10 * time.Millisecond, off: 30 * time.Second, error: 5 * time.Millisecond},
		{peer: -time.Minute, rtt: 2 * time.Millisecond, off: -time.Minute - time.Millisecond, error: time.Millisecond},
		{peer: 0, rtt: 0, off: 0, error: 0},
		{peer: 100 * 24 * time.Hour, rtt: 3 * time.Microsecond, off: 100*24*time.Hour - time.Microsecond, error: 2 * time.Microsecond},
	} {
		o.measured(sent.Add(tc.peer), sent, sent.Add(tc.rtt))
		s, ok := o.get()
		require.True(t, ok)
		require.Equal(t, tc.off, s.Offset, "%+v", tc)
		require.Equal(t, tc.error, s.Error, "%+v", tc)
	}
	before, _ := o.get()
	o.measured(sent, sent, sent.Add(-time.Millisecond))
	o.measured(sent, sent, sent.Add(3*time.Second))
	after, _ := o.get()
	require.Equal(t, before.Offset, after.Offset, "neither kept")
	require.Equal(t, before.Error, after.Error)
}

// TestClockOffsetBeyondRange: an offset beyond what the packed word holds
// (±2^43 µs, about 101 days) reads as far off, not wrapped around: a
// peer 2^44 µs (about 203.6 days) ahead, or a clock that far behind its
// peers, must not read as in agreement.
func TestClockOffsetBeyondRange(t *testing.T) {
	var o clockOffset
	sent := time.UnixMilli(1_800_000_000_000)
	for _, peer := range []time.Duration{
		1 << 44 * time.Microsecond, -(1 << 44 * time.Microsecond),
		1<<44*time.Microsecond + 100*time.Millisecond, 3 << 44 * time.Microsecond,
	} {
		o.measured(sent.Add(peer), sent, sent.Add(2*time.Millisecond))
		s, ok := o.get()
		require.True(t, ok)
		require.Greater(t, s.Offset.Abs(), 100*24*time.Hour, "peer %v ahead read as %v", peer, s.Offset)
		require.Equal(t, peer > 0, s.Offset > 0, "peer %v ahead read as %v", peer, s.Offset)
	}
}

// TestClockOffsetReadWhole: a measurement is read back whole, its offset
// with its own clock reading (ClockSample.Wall: this clock as the answer
// came), however many exchanges store theirs at once.
func TestClockOffsetReadWhole(t *testing.T) {
	var o clockOffset
	base := time.UnixMilli(1_800_000_000_000)
	var wg sync.WaitGroup
	var done atomic.Int32
	const writers, each = 4, 2000
	for w := range writers {
		wg.Go(func() {
			defer done.Add(1)
			for k := range each {
				i := k*writers + w
				sent := base.Add(time.Duration(i) * time.Second)
				// The peer i ms ahead of the midpoint; answered 2 ms after.
				o.measured(sent.Add(time.Duration(i+1)*time.Millisecond), sent, sent.Add(2*time.Millisecond))
				if k%16 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	reads := 0
	for done.Load() < writers || reads == 0 {
		s, ok := o.get()
		if !ok {
			continue
		}
		reads++
		i := int(s.Offset / time.Millisecond)
		require.Equal(t, base.Add(time.Duration(i)*time.Second+2*time.Millisecond), s.Wall, "offset %v read with another's clock reading", s.Offset)
		require.Equal(t, time.Millisecond, s.Error)
	}
	wg.Wait()
}

// BenchmarkClockOffsetMeasured: what measuring a peer's clock adds to
// every exchange.
func BenchmarkClockOffsetMeasured(b *testing.B) {
	b.ReportAllocs()
	var o clockOffset
	sent := time.Now()
	peer, got := sent.Add(time.Millisecond), sent.Add(100*time.Microsecond)
	for b.Loop() {
		o.measuredAfter(peer, sent, got, time.Now()) // as exchange reads it
	}
}
