package leakcheck

import (
	"fmt"
	"testing"
)

// tb takes Register's cleanup and the check's errors, so that a test can
// run the check and see what it says.
type tb struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (t *tb) Helper()           {}
func (t *tb) Cleanup(f func())  { t.cleanups = append(t.cleanups, f) }
func (t *tb) Error(args ...any) { t.errs = append(t.errs, fmt.Sprint(args...)) }

func (t *tb) check() []string {
	for _, f := range t.cleanups {
		f()
	}
	return t.errs
}

// A goroutine started after Register and still running at the check is a
// leak; one running before it, or one that ended, is not. (The check's
// ignore set was taken in the cleanup in eleven tests, which made them
// pass whatever leaked.)
func TestRegisterSeesWhatWasLeft(t *testing.T) {
	before := make(chan struct{})
	defer close(before)
	go func() { <-before }() // running before Register: not the test's

	leaky := &tb{TB: t}
	Register(leaky)
	left := make(chan struct{})
	go func() { <-left }()
	if errs := leaky.check(); len(errs) == 0 {
		t.Error("a goroutine left running is not reported")
	}
	close(left)

	clean := &tb{TB: t}
	Register(clean)
	done := make(chan struct{})
	go func() { close(done) }()
	<-done
	if errs := clean.check(); len(errs) != 0 {
		t.Errorf("no goroutine left, yet: %v", errs)
	}
}
