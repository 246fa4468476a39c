package testcluster

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
)

// Every node an in-process cluster starts is stopped at the end of its
// test, and with it every goroutine the node and Pebble started. fasthttp
// leaves three kinds behind that end by themselves, later, and are not
// the nodes': a HostClient's idle-connection cleaner sleeps up to
// MaxIdleConnDuration (30 s for peers) before it sees no connection left;
// a stopped server's worker-pool cleaner finishes its sleep (10 s); the
// process-wide server date updater never ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.Library()...)
}
