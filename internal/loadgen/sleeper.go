package loadgen

import (
	"sync"
	"time"
)

// sleeper waits until a request's intended send time. In a constant-rate run
// latency is measured from that time, so the sleeper's own lateness is
// charged to the server: it must wake up on time.
//
// Go timers cannot: when the process is idle the runtime blocks in
// epoll_pwait, whose timeout has millisecond resolution, so a sub-millisecond
// sleep overshoots by ~1ms — measured here, enough to turn a 30µs server into
// a 700µs one at low rates. On Linux a per-worker timerfd read through the
// netpoller wakes within tens of microseconds instead; elsewhere, or if
// timerfd is unavailable, the sleeper falls back to a time.Timer.
type sleeper struct {
	tf    timerfd // zero if unavailable; never reassigned (interrupt reads it)
	tfOff bool    // set by the owning worker if the timerfd failed
	buf   [8]byte // expiration count read from the timerfd
	timer *time.Timer
	stop  chan struct{} // closed by interrupt
	once  sync.Once
}

func newSleeper() *sleeper {
	s := &sleeper{stop: make(chan struct{})}
	if tf, err := openTimerfd(); err == nil {
		s.tf = tf
	}
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	return s
}

// until waits until t. It reports false if the sleeper was interrupted.
func (s *sleeper) until(t time.Time) bool {
	select {
	case <-s.stop:
		return false
	default:
	}
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	if s.tf.ok() && !s.tfOff {
		if err := s.tf.wait(d, s.buf[:]); err == nil {
			return true
		}
		select {
		case <-s.stop:
			return false // the read was cut short by interrupt
		default:
		}
		// An unexpected timerfd failure: keep pacing with the timer.
		s.tfOff = true
		d = time.Until(t)
	}
	s.timer.Reset(d)
	select {
	case <-s.timer.C:
		return true
	case <-s.stop:
		s.timer.Stop()
		return false
	}
}

// interrupt makes the current and all later waits return false. It may be
// called from any goroutine, any number of times.
func (s *sleeper) interrupt() {
	s.once.Do(func() {
		close(s.stop)
		s.tf.interrupt()
	})
}

// close releases the timerfd.
func (s *sleeper) close() {
	s.timer.Stop()
	s.tf.close()
}
