//go:build !linux

package loadgen

import (
	"errors"
	"time"
)

// timerfd exists only on Linux; elsewhere the sleeper uses time.Timer.
type timerfd struct{}

func openTimerfd() (timerfd, error) { return timerfd{}, errors.ErrUnsupported }

func (timerfd) ok() bool                         { return false }
func (timerfd) wait(time.Duration, []byte) error { return errors.ErrUnsupported }
func (timerfd) interrupt()                       {}
func (timerfd) close()                           {}
