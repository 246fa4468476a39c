// Package leakcheck checks that a test leaves no goroutine behind, as
// goleak does, but for the goroutines fasthttp keeps for reasons outside
// dhtkv's control:
//
//   - a HostClient's idle-connection cleaner sleeps for MaxIdleConnDuration
//     (30 s for peers) between passes and cannot be woken: even after
//     every pooled connection is closed it exits only when its sleep ends;
//   - a stopped server's worker-pool cleaner sleeps out its
//     MaxIdleWorkerDuration (10 s) the same way;
//   - the server date updater and the default dialer's address cache
//     cleaner are started once per process, at first use, and never end.
package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

// Library is the goroutines of fasthttp's that may outlive what started
// them (see the package's comment).
func Library() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	}
}

// Register makes t fail, once it and its cleanups registered before this
// call are done, if a goroutine is left that was not running when Register
// was called (Library's excepted). Call it first, so that its check runs
// after every other cleanup. The goroutines running now are taken now: a
// goleak.IgnoreCurrent taken in the cleanup itself would ignore every leak.
func Register(t testing.TB) {
	t.Helper()
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, Library()...)
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}
