// Package node assembles one dhtkv server from its parts: store, read cache,
// clock, coordinator, HTTP API, admin listener. The binary (cmd/dhtkv) and
// the tests' in-process clusters both start nodes through it, so what the
// tests exercise is what ships.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/admin"
	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Config is everything a node is started with; cmd/dhtkv fills it from flags.
type Config struct {
	Listen      string // public API, e.g. 127.0.0.1:8080
	AdminListen string // pprof and /metrics; empty: no admin listener
	DataDir     string

	CacheBytes      int64 // read cache; 0 disables it
	BlockCacheBytes int64 // Pebble block cache
	MemTableBytes   uint64
	Sync            bool
	// L0CompactionThreshold: see store.Options.
	L0CompactionThreshold int

	MaxKeyBytes    int
	MaxValueBytes  int
	MaxHeaderBytes int

	ReadTimeout  time.Duration // whole request, including the body
	WriteTimeout time.Duration
	IdleTimeout  time.Duration

	Cluster        string // comma-separated node URLs; empty: a cluster of one
	Self           string // this node's URL; empty: http://<Listen>
	ClusterSecret  string
	ReplicaTimeout time.Duration
	ReadHedgeDelay time.Duration
	PeerConns      int

	Logger *slog.Logger
}

// DefaultConfig returns the defaults the flags document.
func DefaultConfig() Config {
	return Config{
		Listen:                "127.0.0.1:8080",
		DataDir:               "./data/node1",
		CacheBytes:            64 << 20,
		BlockCacheBytes:       64 << 20,
		MemTableBytes:         16 << 20,
		Sync:                  true,
		L0CompactionThreshold: 16,
		MaxKeyBytes:           1024,
		MaxValueBytes:         16 << 20,
		MaxHeaderBytes:        8 << 10,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ReplicaTimeout:        300 * time.Millisecond,
		ReadHedgeDelay:        5 * time.Millisecond,
		PeerConns:             1,
	}
}

// Node is a running server.
type Node struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	cache   *cache.Cache
	coord   *cluster.Coordinator
	metrics *metrics.Metrics
	api     *httpapi.Server

	srv      *fasthttp.Server
	ln       net.Listener
	adminSrv *http.Server
	adminLn  net.Listener
	served   chan error
}

// Start opens the store and starts serving. On error everything opened so
// far is closed again.
func Start(cfg Config) (_ *Node, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Self == "" {
		cfg.Self = "http://" + cfg.Listen
	}
	topo, err := cluster.ParseTopology(cfg.Cluster, cfg.Self)
	if err != nil {
		return nil, err
	}
	if cfg.MaxKeyBytes < 1 || cfg.MaxValueBytes < 0 || cfg.MaxHeaderBytes < 1024 {
		return nil, fmt.Errorf("limits: key %d, value %d, header %d bytes: out of range", cfg.MaxKeyBytes, cfg.MaxValueBytes, cfg.MaxHeaderBytes)
	}
	if cfg.ReplicaTimeout <= 0 {
		return nil, fmt.Errorf("--replica-timeout must be positive")
	}
	if cfg.PeerConns < 1 {
		return nil, fmt.Errorf("--peer-conns must be at least 1")
	}
	if cfg.ReadHedgeDelay < 0 {
		return nil, fmt.Errorf("--read-hedge-delay must not be negative")
	}
	clock, err := hlc.New(topo.Self, nil)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: log, metrics: metrics.New(), served: make(chan error, 1)}
	defer func() {
		if err != nil {
			n.closeStorage()
		}
	}()
	n.store, err = store.Open(cfg.DataDir, store.Options{
		Sync: cfg.Sync, L0CompactionThreshold: cfg.L0CompactionThreshold, BlockCacheBytes: cfg.BlockCacheBytes, MemTableBytes: cfg.MemTableBytes, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	// Versions issued after a restart must be newer than every stored one.
	bound, err := n.store.ClockBound()
	if err != nil {
		return nil, err
	}
	clock.Restore(bound, n.store.SetClockBound)
	if n.cache, err = cache.New(cfg.CacheBytes); err != nil {
		return nil, err
	}
	n.metrics.RegisterCache(n.cache)
	n.metrics.RegisterPebble(n.store.Metrics, n.store.Stalls)
	// Every stored version is at most the restored bound (node bits set):
	// the clock observes a version before it is stored and persists a
	// bound above it first. A store with data but no bound (not written
	// by this release) gets a filter that always reads.
	floor := bound | hlc.MaxNodeID
	if bound == 0 {
		floor = 0
		if has, err := n.store.HasData(); err != nil {
			return nil, err
		} else if has {
			floor = ^uint64(0)
		}
	}
	local := &replica.Replica{Store: n.store, Cache: n.cache, Versions: replica.NewVersionFilter(replica.DefaultVersionSlots, floor)}
	n.coord = cluster.NewCoordinator(topo, clock, local, cluster.PeerOptions{
		Timeout: cfg.ReplicaTimeout, Conns: cfg.PeerConns, Secret: cfg.ClusterSecret,
		ReadHedgeDelay: cfg.ReadHedgeDelay,
		// Peers run with the same limits: a batch stays within their
		// request body limit below.
		MaxBatchBytes: min(256<<10, cfg.MaxValueBytes),
	}, n.metrics, log)
	n.api = &httpapi.Server{
		Coord: n.coord, Local: local, Clock: clock, Metrics: n.metrics, Secret: cfg.ClusterSecret, Log: log,
		Limits: httpapi.Limits{MaxKeyBytes: cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes},
		// A range stream may run for any time; the write timeout then
		// bounds a stall instead of the whole response.
		ScanIdleTimeout: cfg.WriteTimeout,
	}
	n.srv = &fasthttp.Server{
		Handler:      n.api.Handler,
		ErrorHandler: n.api.ErrorHandler,
		Name:         "dhtkv",
		// The body limit is enforced by fasthttp before the handler runs
		// (413). An internal batch holding one largest write carries its
		// key, the envelope header and framing on top of the value.
		MaxRequestBodySize: cfg.MaxValueBytes + cfg.MaxKeyBytes + 64,
		// Request line and headers must fit in the read buffer: this is
		// the header size limit.
		ReadBufferSize:               cfg.MaxHeaderBytes,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{log},
	}
	if n.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if cfg.AdminListen != "" {
		if n.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			n.ln.Close()
			return nil, fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
		}
		n.adminSrv = &http.Server{Handler: admin.Handler(n.metrics.Registry), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := n.adminSrv.Serve(n.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin listener", "err", err)
			}
		}()
	}
	// fasthttp's Shutdown returns at once if Serve has not registered the
	// listener yet, and a Serve that starts later would then run handlers
	// against a closed store. Return only once Serve is accepting.
	ln := &readyListener{Listener: n.ln, ready: make(chan struct{})}
	go func() { n.served <- n.srv.Serve(ln) }()
	<-ln.ready
	log.Info("dhtkv node started", "listen", n.ln.Addr().String(), "admin", cfg.AdminListen,
		"data_dir", cfg.DataDir, "self", topo.Nodes[topo.Self], "cluster_size", topo.Size(), "sync", cfg.Sync)
	return n, nil
}

// Addr is the public listener's address (useful with port 0).
func (n *Node) Addr() string { return n.ln.Addr().String() }

// AdminAddr is the admin listener's address, or "" without one.
func (n *Node) AdminAddr() string {
	if n.adminLn == nil {
		return ""
	}
	return n.adminLn.Addr().String()
}

// Metrics returns the node's instruments.
func (n *Node) Metrics() *metrics.Metrics { return n.metrics }

// Shutdown stops accepting connections, waits up to ctx's deadline for
// in-flight requests and background replica calls, then closes the store
// cleanly. It is safe to call once.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.adminSrv != nil {
		n.adminSrv.Close()
	}
	// Range streams may run for any time: abort them (their clients see a
	// truncated body) rather than let them hold the shutdown.
	n.api.Close()
	if err := n.srv.ShutdownWithContext(ctx); err != nil {
		// Handlers are still running and may use the store: closing it
		// under them would crash them. Leave it to process exit; every
		// acknowledged write is already in the WAL (fsynced with --sync).
		return fmt.Errorf("shutdown http (store left open): %w", err)
	}
	if err := <-n.served; err != nil {
		n.log.Warn("serve", "err", err)
	}
	// Stragglers are bounded by the replica timeout.
	n.coord.Close()
	if err := n.closeStorage(); err != nil {
		return err
	}
	n.log.Info("dhtkv node stopped", "listen", n.cfg.Listen)
	return nil
}

func (n *Node) closeStorage() error {
	n.cache.Close()
	if n.store != nil {
		return n.store.Close()
	}
	return nil
}

// readyListener reports the first Accept: by then fasthttp's Serve has
// registered the listener, so Shutdown can stop it.
type readyListener struct {
	net.Listener
	once  sync.Once
	ready chan struct{}
}

func (l *readyListener) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.ready) })
	return l.Listener.Accept()
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}
