package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/node"
)

// endpoint is the URL of the node the examples run against, started by
// TestMain; examples cannot start one themselves (they get no
// *testing.T). It is written once, before any test or example runs.
var endpoint string

// TestMain serves one real node for the examples, runs the tests and
// examples (the tests start their own clusters), stops the node, and then
// checks that no goroutine outlived them: the clients' connections are
// closed by Close, the nodes' by Shutdown.
func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dhtkv-client-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// A port of our choosing rather than 0: the node's URL (--self) is
	// made from its --listen.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	addr := l.Addr().String()
	l.Close()
	cfg := node.DefaultConfig()
	cfg.Listen = addr
	cfg.DataDir = dir
	cfg.Store.Sync = false
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "example node:", err)
		return 1
	}
	endpoint = "http://" + n.Addr()
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "example node:", err)
		return 1
	}
	if code == 0 {
		if err := goleak.Find(ignoreLibraryGoroutines...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// ignoreLibraryGoroutines are the nodes' library goroutines that outlive
// them and cannot be stopped: fasthttp's worker pool cleaner and its
// HostClient's connection cleaner sleep out their idle periods, and the
// first fasthttp server of a process starts a goroutine that updates the
// Date header every second, its default dialer one that expires its DNS
// cache, both for the life of the process.
var ignoreLibraryGoroutines = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
}
