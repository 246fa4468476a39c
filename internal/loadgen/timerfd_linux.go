package loadgen

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timerfd is a Linux timer file descriptor read through Go's netpoller, so
// that a waiting worker parks its goroutine, not a thread, and epoll wakes it
// with the timer's microsecond precision.
type timerfd struct {
	f  *os.File
	fd int
}

func openTimerfd() (timerfd, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return timerfd{}, fmt.Errorf("timerfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	// Deadlines only work on files the netpoller manages; interrupt needs them.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		_ = f.Close()
		return timerfd{}, fmt.Errorf("timerfd is not pollable: %w", err)
	}
	return timerfd{f: f, fd: fd}, nil
}

func (t timerfd) ok() bool { return t.f != nil }

// wait arms the timer for d and blocks until it fires or interrupt is called.
func (t timerfd) wait(d time.Duration, buf []byte) error {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		return fmt.Errorf("timerfd_settime: %w", err)
	}
	if _, err := t.f.Read(buf); err != nil {
		return fmt.Errorf("read timerfd: %w", err)
	}
	return nil
}

// interrupt makes a pending and every later read fail at once.
func (t timerfd) interrupt() {
	if t.f != nil {
		_ = t.f.SetReadDeadline(time.Unix(1, 0))
	}
}

func (t timerfd) close() {
	if t.f != nil {
		_ = t.f.Close()
	}
}
