package loadgen

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestSleeperWakesOnTime(t *testing.T) {
	s := newSleeper()
	defer s.close()
	if runtime.GOOS == "linux" {
		ok(t, s.tf.ok(), "timerfd unavailable on linux")
	}
	const d = 200 * time.Microsecond
	var late []time.Duration
	for range 50 {
		target := time.Now().Add(d)
		ok(t, s.until(target), "until returned false")
		l := time.Since(target)
		ok(t, l >= 0, "woke %v early", -l)
		late = append(late, l)
	}
	slices.Sort(late)
	t.Logf("lateness p50 %v p90 %v max %v", late[25], late[45], late[49])
	if s.tf.ok() {
		// A Go timer overshoots sub-millisecond sleeps by ~1ms when idle.
		ok(t, late[25] < 600*time.Microsecond, "median lateness %v", late[25])
	}
	ok(t, s.until(time.Now().Add(-time.Second)), "a past time must not block")
}

func TestSleeperInterrupt(t *testing.T) {
	s := newSleeper()
	defer s.close()
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.interrupt()
	}()
	start := time.Now()
	ok(t, !s.until(start.Add(time.Hour)), "interrupted wait reported success")
	ok(t, time.Since(start) < 5*time.Second, "interrupt took %v", time.Since(start))
	ok(t, !s.until(time.Now().Add(time.Millisecond)), "wait after interrupt reported success")
	s.interrupt() // idempotent
}
