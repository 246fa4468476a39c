// Command dhtkv runs one node of the dhtkv key-value store.
//
//	dhtkv --listen 127.0.0.1:8080 --data-dir ./data/node1 [--admin-listen 127.0.0.1:6060]
//	      [--cluster http://127.0.0.1:8080,http://127.0.0.1:8081 --self http://127.0.0.1:8080]
//
// Every flag can also come from a DHTKV_* environment variable or from the
// --config file; the command line wins over the environment, which wins
// over the file (parseFlags). See README.md for every flag. SIGTERM or
// SIGINT stops it gracefully: stop accepting, finish in-flight requests
// (bounded by --shutdown-timeout), close Pebble, exit 0. SIGHUP rereads
// the TLS files (--tls-cert, --tls-key, --peer-tls-ca) without a restart;
// if they do not load, the ones in use stay and the error is logged.
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

	"github.com/peterbourgon/ff/v3"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/node"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usage heads dhtkv -h, above the flags.
const usage = `usage: dhtkv [flags]

Every flag can also be set by an environment variable named after it
(--cache-bytes: DHTKV_CACHE_BYTES=64MiB) and by a line of the file that
--config names ("cache-bytes 64MiB"; blank lines and # comments are
ignored). A flag on the command line wins over the environment, which wins
over the file. An empty variable counts as unset.

flags:`

// settings are what one run is made of: the node's configuration and what
// the command itself does with it.
type settings struct {
	cfg       node.Config
	shutdown  time.Duration
	logLevel  slog.Level
	logFormat string
	version   bool
}

// parseFlags reads the flags from args, then from DHTKV_* environment
// variables, then from the --config file, each source setting only the
// flags the ones before it left unset. -h writes the help to stdout and
// returns flag.ErrHelp.
func parseFlags(args []string, stdout io.Writer) (*settings, error) {
	s := &settings{cfg: node.DefaultConfig()}
	cfg := &s.cfg
	fs := flag.NewFlagSet("dhtkv", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints one line itself
	fs.String("config", "", "read flags from this `file`, one per line: name, a space, the value (command-line flags and DHTKV_* variables win)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "public API address `host:port`")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "Pebble data `directory`")
	fs.StringVar(&cfg.AdminListen, "admin-listen", "", "admin `host:port` for /debug/pprof/, /metrics, /livez, /readyz, /repair, /snapshot and /cluster (off when empty)")
	sizeVar(fs, &cfg.CacheBytes, "cache-bytes", "read cache capacity, a `size` (64MiB, 1GB, bytes; 0 disables the cache)")
	sizeVar(fs, &cfg.BlockCacheBytes, "block-cache-bytes", "Pebble block cache, a `size`")
	sizeVar(fs, &cfg.MemTableBytes, "memtable-bytes", "Pebble memtable, a `size` (up to 4 in memory)")
	fs.IntVar(&cfg.L0CompactionThreshold, "l0-compaction-threshold", cfg.L0CompactionThreshold, "L0 sublevels that trigger a compaction into the level below (writes stall at 4x)")
	fs.BoolVar(&cfg.Sync, "sync", cfg.Sync, "fsync the WAL before acknowledging each write (false: fast, can lose acknowledged writes on a crash)")
	sizeVar(fs, &cfg.MaxKeyBytes, "max-key-bytes", "longest key, a `size` (400 beyond)")
	sizeVar(fs, &cfg.MaxValueBytes, "max-value-bytes", "largest value, a `size` (413 beyond)")
	sizeVar(fs, &cfg.MaxHeaderBytes, "max-header-bytes", "largest request line + headers, a `size`")
	sizeVar(fs, &cfg.MaxInflightBodyBytes, "max-inflight-body-bytes", "budget of the buffers holding the bodies of requests in flight, a `size`; a body beyond gets 503 (0: no budget)")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "time to read a whole request")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "time to write a whole response")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "keep-alive idle time before a connection is closed")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most client `connections` open at once, peers' included; beyond, 503 and closed (0: the descriptor limit less a reserve for Pebble and peers, see README)")
	fs.IntVar(&cfg.MaxConnectionsPerIP, "max-connections-per-ip", cfg.MaxConnectionsPerIP, "most `connections` open at once from one address; beyond, 429 and closed (0: no cap; behind a proxy every client has its address)")
	fs.StringVar(&cfg.Cluster, "cluster", "", "comma-separated `URLs` of all nodes, the same list on every node; seeds the cluster map at the first start only (empty: a cluster of one)")
	fs.StringVar(&cfg.Join, "join", "", "a member's `URL`: take the cluster map from it at the first start (after dhtkvctl join or replace added this node)")
	fs.StringVar(&cfg.Self, "self", "", "this node's `URL` in --cluster (default http://<listen>)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", "", "shared `secret` required on node-to-node requests (403 without it); visible to other local users in ps: prefer --cluster-secret-file")
	fs.StringVar(&cfg.ClusterSecretFile, "cluster-secret-file", "", "`file` holding the shared secret, one line (mode 600); without a secret or --peer-tls-ca every address must be loopback")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM `file` of this node's certificate chain, leaf first: the public listener then speaks only TLS, to clients and nodes, and this node calls the others over TLS (all nodes or none; reread on SIGHUP)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM `file` of --tls-cert's private key (mode 600; reread on SIGHUP)")
	fs.StringVar(&cfg.PeerTLSCA, "peer-tls-ca", "", "PEM `file` of the CA certificates node certificates chain to: mutual TLS between nodes, internal endpoints 403 without a client certificate from it; --tls-cert must then allow serverAuth and clientAuth (reread on SIGHUP)")
	fs.DurationVar(&cfg.ReplicaTimeout, "replica-timeout", cfg.ReplicaTimeout, "deadline of one request's replica calls (dial, write, read)")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", cfg.MaxClockSkew, "how far ahead of this node's clock another node's versions may be; a node further off from its peers refuses to coordinate writes")
	fs.StringVar(&cfg.ReadRepair, "read-repair", cfg.ReadRepair, "what a GET does with stale replicas it finds: blocking (repair them before replying), async, off")
	fs.DurationVar(&cfg.HintWindow, "hint-window", cfg.HintWindow, "drop hints (writes kept for a replica that missed them) older than this; anti-entropy repairs what they carried")
	sizeVar(fs, &cfg.HintMaxBytes, "hint-max-bytes", "most hints kept for one replica, a `size`")
	sizeVar(fs, &cfg.HintReplayRate, "hint-replay-rate", "most hints delivered to returning replicas per second, a `size`")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replication factor: nodes that keep each partition, the default and largest from; seeds the cluster map (0: the --cluster size)")
	fs.DurationVar(&cfg.AEInterval, "ae-interval", cfg.AEInterval, "how often anti-entropy compares this node's data with each peer (0: only on demand, POST /repair on the admin port)")
	sizeVar(fs, &cfg.AERate, "ae-rate", "most records anti-entropy pulls and pushes per second, a `size`")
	fs.IntVar(&cfg.AEConcurrency, "ae-concurrency", cfg.AEConcurrency, "peers anti-entropy compares at once")
	fs.IntVar(&cfg.MaxScans, "max-scans", cfg.MaxScans, "range `streams` in flight, public and internal together; beyond, 429")
	sizeVar(fs, &cfg.ScanMinRate, "scan-min-rate", "slowest a range stream's client may read, a `size` per second: a piece of n bytes must be taken within 5s + n/rate, else the stream is aborted (0: no minimum)")
	fs.DurationVar(&cfg.GCGrace, "gc-grace", cfg.GCGrace, "keep tombstones and expired values at least this long after the delete or expiry; then remove them once every replica has them (must exceed --hint-window + --max-clock-skew; 0: their sum + 1h)")
	fs.DurationVar(&cfg.ReadHedgeDelay, "read-hedge-delay", cfg.ReadHedgeDelay, "a GET asks ack replicas first and the other from-ack on a failure or after this delay, longer while the fastest peer's 95th-percentile read latency is (0: all at once)")
	fs.IntVar(&cfg.PeerConns, "peer-conns", cfg.PeerConns, "batches in flight to each peer at once, for reads and for writes each (one connection each)")
	fs.DurationVar(&s.shutdown, "shutdown-timeout", 10*time.Second, "how long to wait for in-flight requests on SIGTERM")
	logLevel := fs.String("log-level", "info", "`level`: debug, info, warn, error")
	fs.StringVar(&s.logFormat, "log-format", "text", "`format` of the log lines on stderr: text (key=value) or json (one object per line)")
	fs.BoolVar(&s.version, "version", false, "print the version and exit")
	err := ff.Parse(fs, args,
		ff.WithEnvVarPrefix("DHTKV"),
		ff.WithConfigFileFlag("config"),
		ff.WithConfigFileParser(ff.PlainParser))
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil, err
	case err != nil:
		return nil, err
	case s.version:
		return s, nil
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.MemTableBytes == 0:
		return nil, errors.New("--memtable-bytes must be positive")
	case cfg.L0CompactionThreshold < 1:
		return nil, errors.New("--l0-compaction-threshold must be at least 1")
	}
	if err := s.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if _, err := newLogger(io.Discard, s.logFormat, s.logLevel); err != nil {
		return nil, err
	}
	return s, nil
}

// newLogger returns the logger writing to w in format (text or json) at
// level and above.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func run(args []string, stdout, stderr io.Writer) int {
	s, err := parseFlags(args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "dhtkv: %v (see dhtkv -h)\n", err)
		return 2
	case s.version:
		fmt.Fprintf(stdout, "dhtkv %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
		return 0
	}
	cfg := s.cfg
	cfg.Logger, _ = newLogger(stderr, s.logFormat, s.logLevel) // checked by parseFlags
	// Before the node derives its connection cap from the limit; logged
	// once it started, so that a refused configuration stays one line.
	nofile, nofileErr := raiseNoFile()
	// Before the node starts: SIGHUP's default action ends the process,
	// and a certificate renewal may signal a node that is still starting.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

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
	for stop := false; !stop; {
		select {
		case <-hup:
			// Logged either way; a failed reload keeps the files in use.
			_ = n.Reload()
		case got := <-sig:
			cfg.Logger.Info("shutting down", "signal", got.String())
			stop = true
		case <-n.Left():
			cfg.Logger.Info("shutting down: this node was decommissioned; its data directory is no longer used")
			stop = true
		case err := <-n.Failed():
			// A node that accepts no connections must not look alive to a
			// supervisor: stop cleanly, then exit non-zero.
			cfg.Logger.Error("shutting down: the node stopped serving", "err", err)
			code, stop = 1, true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.shutdown)
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
