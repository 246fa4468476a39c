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
	// How late it wakes is logged, not asserted: the timerfd's tens of
	// microseconds and a Go timer's ~1 ms are too close to tell apart on a
	// busy machine. That the timerfd did the waiting is asserted instead.
	t.Logf("lateness p50 %v p90 %v max %v", late[25], late[45], late[49])
	if runtime.GOOS == "linux" {
		ok(t, !s.tfOff, "the timerfd failed and the sleeper fell back to a timer")
	}
	ok(t, s.until(time.Now().Add(-time.Second)), "a past time must not block")
}

func TestSleeperInterrupt(t *testing.T) {
	s := newSleeper()
	defer s.close()
	go func() {
		// Most likely interrupts a wait already blocked; the wait is not
		// observable, and an earlier interrupt is a valid case too (it is
		// sticky).
		time.Sleep(50 * time.Millisecond)
		s.interrupt()
	}()
	start := time.Now()
	ok(t, !s.until(start.Add(time.Hour)), "interrupted wait reported success")
	// A loose bound: an ignored interrupt would wait the hour.
	ok(t, time.Since(start) < 5*time.Second, "interrupt took %v", time.Since(start))
	ok(t, !s.until(time.Now().Add(time.Millisecond)), "wait after interrupt reported success")
	s.interrupt() // idempotent
}
