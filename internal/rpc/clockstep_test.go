package rpc

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// stepped returns t's wall reading moved by step with t's monotonic
// reading kept: what time.Now returns after the host's clock was stepped
// (settimeofday moves the wall clock, not the monotonic one). Exchanges
// read this node's clock with Options.Now, which is hlc.Clock.Wall, which
// is time.Now in production: both readings carry a monotonic one.
func stepped(t time.Time, step time.Duration) time.Time {
	type rep struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	s := t.Add(step)
	(*rep)(unsafe.Pointer(&s)).ext = (*rep)(unsafe.Pointer(&t)).ext
	return s
}

// TestClockOffsetAcrossAStep: this clock is stepped 30 s ahead
// while an exchange is out (10 ms). The sample must not say that the peer
// agrees with this clock: clockOffset.measured takes the round trip from
// the monotonic readings and the midpoint from sent's wall reading, the
// one from before the step, so the peer reads 0 ±5 ms from a clock now
// 30 s ahead, and that sample was stamped fresh (At: after the step).
// TestClockOffset's comment says such an exchange is not kept.
func TestClockOffsetAcrossAStep(t *testing.T) {
	sent := time.Now()
	require.Equal(t, 10*time.Millisecond, stepped(sent.Add(10*time.Millisecond), 30*time.Second).Sub(sent),
		"the monotonic readings: 10 ms apart")
	got := stepped(sent.Add(10*time.Millisecond), 30*time.Second)
	require.Equal(t, 30*time.Second+10*time.Millisecond, got.Round(0).Sub(sent.Round(0)), "the wall readings: stepped")
	peer := sent.Round(0).Add(5 * time.Millisecond) // the peer's clock is right
	var o clockOffset
	o.measured(peer, sent, got)
	s, ok := o.get()
	if !ok {
		return // discarded: fine
	}
	t.Logf("sample: offset %v ± %v", s.Offset, s.Error)
	require.Greater(t, s.Offset.Abs()+s.Error, 29*time.Second,
		"a sample taken across a 30 s step says the peer agrees with this clock")
}

// TestClockSampleAgeAcrossAStepBack: this host's clock is stepped an hour
// back after a sample was taken. The sample's age (ClockSample.At against
// a later time.Now, as the probe's freshness checks read it) is still
// the time since it was taken: At was a wall time, so after the step an
// old sample of a peer gone silent counted as fresh for an hour, and its
// agreement kept the clock's lease.
func TestClockSampleAgeAcrossAStepBack(t *testing.T) {
	var o clockOffset
	sent := time.Now()
	o.measured(sent.Round(0), sent, sent.Add(time.Millisecond))
	s, ok := o.get()
	require.True(t, ok)
	later := stepped(time.Now().Add(10*time.Second), -time.Hour)
	age := later.Sub(s.At)
	require.Greater(t, age, 9*time.Second, "the sample is 10 s old, whatever the wall clock says")
	require.Less(t, age, 11*time.Second)
}
