// Command dhtkv-baseline is the reference server that dhtkv's benchmarks
// measure against: dhtkv's public entity API (GET, PUT and DELETE on
// /v0/entity?id=<key>, GET /v0/status) served by fasthttp with the server
// settings dhtkv uses, over an in-memory sharded map. No disk, no cache, no
// replication, no metrics.
//
// Its throughput is therefore the most the HTTP layer allows on a given
// machine. Absolute figures move with the machine and with whatever else
// runs on it, so dhtkv's figures are quoted as a ratio to this server's,
// measured in the same run (`make bench`, loadtest/wrk/compare-ceiling.sh,
// loadtest/wrk/cpu-per-request.sh). Data lives only as long as the process.
//
//	dhtkv-baseline --listen 127.0.0.1:18080 [--max-value-bytes 16777216]
//
// SIGTERM or SIGINT stops it gracefully. Fill it with
// `dhtkv-load --fill N --fill-only`, which writes the keys k0..k<N-1> that
// the load generator and the wrk scripts read.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// parseFlags reads the command line into a config.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("dhtkv-baseline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.listen, "listen", cfg.listen, "address `host:port` to serve the entity API on")
	fs.IntVar(&cfg.maxValueBytes, "max-value-bytes", cfg.maxValueBytes, "largest value in `bytes` (413 beyond), as dhtkv's flag")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.maxValueBytes < 0 {
		return cfg, fmt.Errorf("--max-value-bytes %d: must be >= 0", cfg.maxValueBytes)
	}
	return cfg, nil
}

func run(args []string, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		log.Error("bad arguments", "err", err)
		return 2
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		log.Error("listen", "addr", cfg.listen, "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("dhtkv-baseline serving", "addr", ln.Addr().String(), "max_value_bytes", cfg.maxValueBytes)
	if err := serve(ctx, ln, cfg, log); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("dhtkv-baseline stopped")
	return 0
}
