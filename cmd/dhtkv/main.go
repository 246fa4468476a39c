// Command dhtkv runs one node of the dhtkv key-value store.
//
//	dhtkv --listen 127.0.0.1:8080 --data-dir ./data/node1 [--admin-listen 127.0.0.1:6060]
//	      [--cluster http://127.0.0.1:8080,http://127.0.0.1:8081 --self http://127.0.0.1:8080]
//
// See README.md for every flag. SIGTERM or SIGINT stops it gracefully: stop
// accepting, finish in-flight requests (bounded by --shutdown-timeout), close
// Pebble, exit 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dhtkv/dhtkv/internal/node"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg := node.DefaultConfig()
	fs := flag.NewFlagSet("dhtkv", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // we print one line ourselves
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "public API address `host:port`")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "Pebble data `directory`")
	fs.StringVar(&cfg.AdminListen, "admin-listen", "", "admin `host:port` for /debug/pprof/ and /metrics (off when empty)")
	fs.Int64Var(&cfg.CacheBytes, "cache-bytes", cfg.CacheBytes, "read cache capacity in `bytes` (0 disables the cache)")
	fs.Int64Var(&cfg.BlockCacheBytes, "block-cache-bytes", cfg.BlockCacheBytes, "Pebble block cache in `bytes`")
	memtable := fs.Int64("memtable-bytes", int64(cfg.MemTableBytes), "Pebble memtable size in `bytes` (up to 4 in memory)")
	fs.IntVar(&cfg.L0CompactionThreshold, "l0-compaction-threshold", cfg.L0CompactionThreshold, "L0 sublevels that trigger a compaction into the level below (writes stall at 4x)")
	fs.BoolVar(&cfg.Sync, "sync", cfg.Sync, "fsync the WAL before acknowledging each write (false: fast, can lose acknowledged writes on a crash)")
	fs.IntVar(&cfg.MaxKeyBytes, "max-key-bytes", cfg.MaxKeyBytes, "longest key in `bytes` (400 beyond)")
	fs.IntVar(&cfg.MaxValueBytes, "max-value-bytes", cfg.MaxValueBytes, "largest value in `bytes` (413 beyond)")
	fs.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", cfg.MaxHeaderBytes, "largest request line + headers in `bytes`")
	fs.Int64Var(&cfg.MaxInflightBodyBytes, "max-inflight-body-bytes", cfg.MaxInflightBodyBytes, "budget in `bytes` of the buffers holding the bodies of requests in flight; a body beyond gets 503 (0: no budget)")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "time to read a whole request")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "time to write a whole response")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "keep-alive idle time before a connection is closed")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most client `connections` open at once, peers' included; beyond, 503 and closed (0: the descriptor limit less a reserve for Pebble and peers, see README)")
	fs.IntVar(&cfg.MaxConnectionsPerIP, "max-connections-per-ip", cfg.MaxConnectionsPerIP, "most `connections` open at once from one address; beyond, 429 and closed (0: no cap; behind a proxy every client has its address)")
	fs.StringVar(&cfg.Cluster, "cluster", "", "comma-separated `URLs` of all nodes, the same list on every node (empty: a cluster of one)")
	fs.StringVar(&cfg.Self, "self", "", "this node's `URL` in --cluster (default http://<listen>)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", "", "shared `secret` required on node-to-node requests (403 without it)")
	fs.DurationVar(&cfg.ReplicaTimeout, "replica-timeout", cfg.ReplicaTimeout, "deadline of one request's replica calls (dial, write, read)")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", cfg.MaxClockSkew, "how far ahead of this node's clock another node's versions may be; a node further off from its peers refuses to coordinate writes")
	fs.StringVar(&cfg.ReadRepair, "read-repair", cfg.ReadRepair, "what a GET does with stale replicas it finds: blocking (repair them before replying), async, off")
	fs.DurationVar(&cfg.HintWindow, "hint-window", cfg.HintWindow, "drop hints (writes kept for a replica that missed them) older than this; anti-entropy repairs what they carried")
	fs.Int64Var(&cfg.HintMaxBytes, "hint-max-bytes", cfg.HintMaxBytes, "most `bytes` of hints kept for one replica")
	fs.Int64Var(&cfg.HintReplayRate, "hint-replay-rate", cfg.HintReplayRate, "most hint `bytes` per second delivered to returning replicas")
	fs.DurationVar(&cfg.ReadHedgeDelay, "read-hedge-delay", cfg.ReadHedgeDelay, "a GET asks ack replicas first and the other from-ack on a failure or after this delay, longer while the fastest peer's 95th-percentile read latency is (0: all at once)")
	fs.IntVar(&cfg.PeerConns, "peer-conns", cfg.PeerConns, "batches in flight to each peer at once, for reads and for writes each (one connection each)")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long to wait for in-flight requests on SIGTERM")
	logLevel := fs.String("log-level", "info", "`level`: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: dhtkv [flags]")
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "dhtkv: %v (see dhtkv -h)\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dhtkv: unexpected argument %q (see dhtkv -h)\n", fs.Arg(0))
		return 2
	}
	if *memtable <= 0 {
		fmt.Fprintf(stderr, "dhtkv: --memtable-bytes must be positive\n")
		return 2
	}
	cfg.MemTableBytes = uint64(*memtable)
	if cfg.L0CompactionThreshold < 1 {
		fmt.Fprintf(stderr, "dhtkv: --l0-compaction-threshold must be at least 1\n")
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "dhtkv: --log-level: %v\n", err)
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// Before the node derives its connection cap from the limit; logged
	// once it started, so that a refused configuration stays one line.
	nofile, nofileErr := raiseNoFile()

	n, err := node.Start(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "dhtkv: %v\n", err)
		return 1
	}
	if nofileErr != nil {
		// Not fatal: the cap is derived from whatever limit there is.
		cfg.Logger.Warn("could not raise the descriptor limit", "err", nofileErr)
	} else {
		cfg.Logger.Info("descriptor limit (soft raised to hard)", "soft_before", nofile.before, "soft", nofile.soft, "hard", nofile.hard)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	code := 0
	select {
	case s := <-sig:
		cfg.Logger.Info("shutting down", "signal", s.String())
	case err := <-n.Failed():
		// A node that accepts no connections must not look alive to a
		// supervisor: stop cleanly, then exit non-zero.
		cfg.Logger.Error("shutting down: the node stopped serving", "err", err)
		code = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *shutdown)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		cfg.Logger.Error("shutdown", "err", err)
		return 1
	}
	return code
}

// noFile is RLIMIT_NOFILE before and after raiseNoFile.
type noFile struct{ before, soft, hard uint64 }

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit, so that the
// connection cap derived from it (node.DefaultMaxConnections) is as high
// as the system allows. Go's runtime already raises the soft limit to one
// below the hard one at start-up (syscall's init, since Go 1.19); this
// takes the last descriptor and makes both limits visible in the log.
func raiseNoFile() (noFile, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return noFile{}, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	l := noFile{before: lim.Cur, soft: lim.Cur, hard: lim.Max}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return l, fmt.Errorf("setrlimit RLIMIT_NOFILE to %d: %w", lim.Max, err)
		}
		l.soft = lim.Max
	}
	return l, nil
}
