// Package node assembles one dhtkv server from its parts: store, read cache,
// clock, replica, coordinator, rpc server, HTTP API, admin listener. The
// binary (cmd/dhtkv), the tests' in-process clusters and the benchmarks
// all build nodes through it (New), so what they exercise is what ships.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/admin"
	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/gc"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/rebuild"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// Config is everything a node is built from; cmd/dhtkv fills it from its
// flags (the flag of each field is named in its comment), and
// DefaultConfig holds the defaults stated here.
type Config struct {
	// Listen is the public API's address (--listen). The default value is
	// 127.0.0.1:8080.
	Listen string
	// AdminListen is the address of pprof and /metrics (--admin-listen).
	// The default value is empty: no admin listener.
	AdminListen string
	// DataDir is the Pebble directory (--data-dir). The default value is
	// ./data/node1.
	DataDir string

	// CacheBytes is the read cache's capacity in bytes (--cache-bytes); 0
	// disables it. The default value is 64 MiB.
	CacheBytes int64
	// Store configures Pebble (store.Options: --sync, --block-cache-bytes,
	// --memtable-bytes, --l0-compaction-threshold). The default value is
	// store.DefaultOptions().
	Store store.Options

	// MaxKeyBytes is the longest key in bytes (--max-key-bytes; 400
	// beyond). The default value is 1024.
	MaxKeyBytes int
	// MaxValueBytes is the largest value in bytes (--max-value-bytes; 413
	// beyond). The default value is 16 MiB.
	MaxValueBytes int
	// MaxHeaderBytes bounds the request line plus headers in bytes
	// (--max-header-bytes; 431 beyond). The default value is 8 KiB.
	MaxHeaderBytes int
	// MaxInflightBodyBytes is the budget, in bytes, of the buffers holding
	// the bodies of the requests in flight (--max-inflight-body-bytes): a
	// body that would take them past it is refused with 503. It must hold
	// the largest body (an internal batch: MaxValueBytes + MaxKeyBytes +
	// 64); 0: no budget. The default value is 256 MiB.
	MaxInflightBodyBytes int64

	// ReadTimeout is the time to read a whole request, body included
	// (--read-timeout). The default value is 30 s.
	ReadTimeout time.Duration
	// WriteTimeout is the time to write a whole response; a range stream
	// instead may stall this long between writes (--write-timeout). The
	// default value is 30 s.
	WriteTimeout time.Duration
	// IdleTimeout is how long an idle keep-alive connection stays open
	// (--idle-timeout). The default value is 2 min.
	IdleTimeout time.Duration
	// MaxConnections caps the client connections open at once on the
	// public listener, peers' included (--max-connections); a connection
	// beyond it gets 503 and is closed at once. The default value is 0:
	// derived from the descriptor limit by DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionsPerIP caps the connections open at once from one
	// address (--max-connections-per-ip; 429 and closed beyond it; 0: no
	// cap). Behind a proxy every client has the proxy's address: set 0
	// there. The default value is 1024.
	MaxConnectionsPerIP int

	// Cluster is the comma-separated list of every node's URL, the same
	// list in the same order on every node (--cluster). It seeds the
	// cluster map on the node's first start; from then on the map in the
	// data directory is the source of truth and Cluster is not read. The
	// default value is empty: a cluster of one.
	Cluster string
	// Join is a member's URL (--join): a node started with it and an
	// empty data directory takes the cluster map from that member instead
	// of seeding one from Cluster, and must be in it (dhtkvctl join, or
	// replace, adds it). The default value is empty.
	Join string
	// Self is this node's URL in Cluster (--self). The default value is
	// empty, meaning http://<Listen>.
	Self string
	// ClusterSecret is the shared secret node-to-node requests must carry
	// (--cluster-secret, visible to other local users in ps; 403 without
	// it). The default value is empty: none required, and then the node
	// serves only loopback addresses (security.go).
	ClusterSecret string
	// ClusterSecretFile names a file holding ClusterSecret, one line
	// (--cluster-secret-file; keep it mode 600). The default value is
	// empty: none.
	ClusterSecretFile string
	// TLSCert names a PEM file of this node's certificate chain, leaf
	// first (--tls-cert). With it the public listener speaks only TLS,
	// to clients and other nodes alike, and this node calls the other
	// nodes over TLS: every node of a cluster has TLS or none has. The
	// --cluster URLs stay http://host:port, the nodes' names
	// (docs/security.md). Reload reads it again. The default value is
	// empty: plain HTTP.
	TLSCert string
	// TLSKey names the PEM file of TLSCert's private key (--tls-key; keep
	// it mode 600). Given with TLSCert or not at all. The default value
	// is empty.
	TLSKey string
	// PeerTLSCA names a PEM bundle of the CAs node certificates chain to
	// (--peer-tls-ca): mutual TLS between nodes. This node then presents
	// TLSCert when it calls another node, which must therefore allow
	// both the serverAuth and clientAuth extended key usages, accepts a
	// server certificate chaining to the bundle, and its internal
	// endpoints answer only connections with a client certificate that
	// chains to it (403 otherwise). It authenticates nodes as the
	// cluster secret does (security.go). It needs TLSCert; Reload reads
	// it again. The default value is empty: no mutual TLS.
	PeerTLSCA string
	// ReplicaTimeout is one request's deadline for its replica calls
	// (--replica-timeout; 504 beyond). The default value is 300 ms.
	ReplicaTimeout time.Duration
	// MaxClockSkew is how far ahead of this node's wall clock a version
	// from another node may be (--max-clock-skew): a replica refuses
	// writes beyond it, and a node whose clock is off from its peers' by
	// more refuses to coordinate writes. The default value is 5 s.
	MaxClockSkew time.Duration
	// Coordinator configures the request path (cluster.Options:
	// --read-repair, --read-hedge-delay; its Timeout is ReplicaTimeout).
	// The default value is cluster.DefaultOptions().
	Coordinator cluster.Options
	// Handoff configures hinted handoff (handoff.Options: --hint-window,
	// --hint-max-bytes, --hint-replay-rate; Interval has no flag, tests
	// shorten it; its Timeout is ReplicaTimeout). The default value is
	// handoff.DefaultOptions().
	Handoff handoff.Options
	// Replicas is the replication factor: how many nodes keep each
	// partition, the default and largest from of a request (--replicas).
	// It seeds the cluster map, which keeps it from then on. The default
	// value is 0: the size of the --cluster list.
	Replicas int
	// AntiEntropy configures anti-entropy (antientropy.Options:
	// --ae-interval, --ae-rate, --ae-concurrency). The default value is
	// antientropy.DefaultOptions().
	AntiEntropy antientropy.Options
	// MaxScans bounds the range streams in flight, public and internal
	// (--max-scans; 429 beyond). The default value is 64.
	MaxScans int
	// ScanMinRate is the slowest a range stream's client may read, in
	// bytes per second (--scan-min-rate; a piece of n bytes must be taken
	// within 5 s + n/rate; 0: no minimum, only WriteTimeout between
	// pieces). The default value is 16 KiB.
	ScanMinRate int64
	// ScanReleaseAfter is how long a range stream's write to its client
	// may block before the stream releases its store snapshot
	// (httpapi.Server.ScanReleaseAfter; no flag: tests compare streams
	// that never release, -1). The default value is 0: 100 ms.
	ScanReleaseAfter time.Duration
	// RawValueMinBytes is the size from which a GET's value is answered by
	// reference instead of copied (httpapi.Server.RawValueMinBytes; no
	// flag: tests compare with copying, -1). The default value is 0:
	// 16 KiB.
	RawValueMinBytes int
	// GC configures garbage collection (gc.Options: --gc-grace, whose
	// default 0 the node turns into Handoff.Window + MaxClockSkew + 1 h;
	// Interval has no flag, tests shorten it). The default value is
	// gc.DefaultOptions().
	GC gc.Options
	// PeerConns is how many batches may be in flight to each peer at
	// once, for reads and for writes each (--peer-conns). The default
	// value is 1.
	PeerConns int

	// PeerDial, when set, connects to other nodes instead of plain TCP
	// (no flag: tests route node-to-node links through faultnet with it).
	PeerDial func(addr string, timeout time.Duration) (net.Conn, error)
	// ClockOffset is added to the wall clock the node's versions are made
	// from (no flag in the default build: tests skew one node's clock).
	ClockOffset time.Duration

	// Listener, when set, is served instead of listening on Listen, which
	// stays the node's address: its name in the cluster list and in
	// Self's default (no flag: the in-process test clusters serve
	// fasthttputil's in-memory listeners, and route peers to them with
	// PeerDial). Serve takes it over: Shutdown closes it.
	Listener net.Listener
	// AdminListener, when set, is the admin listener instead of one on
	// AdminListen, which then need not be set (no flag, as Listener).
	AdminListener net.Listener
	// FS, when set, is the file system the store lives in, under DataDir
	// (store.Options.FS; no flag: tests pass vfs.NewMem() to run without
	// a disk). The admin listener's /snapshot, which writes to the disk,
	// then answers 501.
	FS vfs.FS

	// Logger receives the node's logs. The default value is nil:
	// slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults Config documents.
func DefaultConfig() Config {
	return Config{
		Listen:               "127.0.0.1:8080",
		DataDir:              "./data/node1",
		CacheBytes:           64 << 20,
		Store:                store.DefaultOptions(),
		MaxKeyBytes:          1024,
		MaxValueBytes:        16 << 20,
		MaxHeaderBytes:       8 << 10,
		MaxInflightBodyBytes: 256 << 20,
		ReadTimeout:          30 * time.Second,
		WriteTimeout:         30 * time.Second,
		IdleTimeout:          2 * time.Minute,
		MaxConnectionsPerIP:  1024,
		ReplicaTimeout:       300 * time.Millisecond,
		MaxClockSkew:         hlc.DefaultMaxAhead,
		Coordinator:          cluster.DefaultOptions(),
		Handoff:              handoff.DefaultOptions(),
		AntiEntropy:          antientropy.DefaultOptions(),
		GC:                   gc.DefaultOptions(),
		MaxScans:             httpapi.DefaultMaxScans,
		ScanMinRate:          httpapi.DefaultScanMinRate,
		PeerConns:            1,
	}
}

// maxBatchBytes is the largest body of an internal batch: one largest
// write carries its key, the envelope header and framing on top of the
// value.
func (cfg *Config) maxBatchBytes() int { return cfg.MaxValueBytes + cfg.MaxKeyBytes + 64 }

// Validate checks the settings that the parts would otherwise misuse: the
// node's own, then each part's (its Options.Validate). The command line
// and New both call it, so a setting is refused in one place.
func (cfg *Config) Validate() error {
	switch {
	case cfg.MaxKeyBytes < 1 || cfg.MaxValueBytes < 0 || cfg.MaxHeaderBytes < 1024:
		return fmt.Errorf("limits: key %d, value %d, header %d bytes: out of range", cfg.MaxKeyBytes, cfg.MaxValueBytes, cfg.MaxHeaderBytes)
	case cfg.ReplicaTimeout <= 0:
		return fmt.Errorf("--replica-timeout must be positive")
	case cfg.PeerConns < 1:
		return fmt.Errorf("--peer-conns must be at least 1")
	case cfg.MaxClockSkew <= 0:
		return fmt.Errorf("--max-clock-skew must be positive")
	case cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0:
		return fmt.Errorf("--max-connections and --max-connections-per-ip must not be negative")
	case cfg.MaxInflightBodyBytes < 0 || cfg.MaxInflightBodyBytes > 0 && cfg.MaxInflightBodyBytes < int64(cfg.maxBatchBytes()):
		return fmt.Errorf("--max-inflight-body-bytes %d must be 0 or hold the largest request body, %d bytes (--max-value-bytes + --max-key-bytes + 64)",
			cfg.MaxInflightBodyBytes, cfg.maxBatchBytes())
	case cfg.GC.Grace < 0 || cfg.GC.Grace > 0 && cfg.GC.Grace <= cfg.Handoff.Window+cfg.MaxClockSkew:
		return fmt.Errorf("--gc-grace %v must exceed --hint-window %v plus --max-clock-skew %v: a hint still held could otherwise bring back a collected delete", cfg.GC.Grace, cfg.Handoff.Window, cfg.MaxClockSkew)
	}
	for _, v := range []interface{ Validate() error }{&cfg.Store, &cfg.Coordinator, &cfg.Handoff, &cfg.AntiEntropy} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// gcGrace is GC.Grace, or its default derived from the hint window and
// the clock skew bound (see GC).
func (cfg *Config) gcGrace() time.Duration {
	if cfg.GC.Grace == 0 {
		return cfg.Handoff.Window + cfg.MaxClockSkew + time.Hour
	}
	return cfg.GC.Grace
}

// Node is one dhtkv server. New builds it without opening any socket;
// Serve (or Start, which does both) puts it on its listeners.
//
// Lifetime: a node made by New owns its store until Close (never served)
// or Shutdown (served); either is called once.
type Node struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	cache *cache.Cache
	// The cluster parts (cluster.go).
	members  *membership.Service
	coord    *cluster.Coordinator
	probe    *probe.Prober
	hints    *handoff.Handoff
	ae       *antientropy.Service
	gc       *gc.Collector
	rebuild  *rebuild.Rebuilder
	streams  *rpc.StreamClient
	registry *prometheus.Registry
	api      *httpapi.Server
	certs    *tlsconf.Certs // nil without TLS

	// checkpoints is nil when the store cannot checkpoint (snapshot.go).
	checkpoints *checkpoints

	srv      *fasthttp.Server
	ln       *limitListener
	adminSrv *http.Server
	adminLn  net.Listener
	served   chan error    // Serve's return, read by Shutdown
	failed   chan error    // Serve's return when no Shutdown asked for it
	leftCh   chan struct{} // fires once the node was decommissioned
	// stopping is set once Shutdown or Close begins: the node is no
	// longer ready, and a Serve that returns is not a failure.
	stopping atomic.Bool
}

// New builds a node: it opens the store, restores the clock, and wires the
// cache, replica, coordinator, rpc server and HTTP API. Nothing listens
// yet. On error everything opened so far is closed again.
func New(cfg Config) (_ *Node, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Self == "" {
		cfg.Self = "http://" + cfg.Listen
	}
	topo, err := clustermap.ParseTopology(cfg.Cluster, cfg.Self)
	if err != nil {
		return nil, err
	}
	if cfg.Join != "" {
		if cfg.Join, err = clustermap.NormalizeURL(cfg.Join); err != nil {
			return nil, fmt.Errorf("--join: %w", err)
		}
		topo = clustermap.Topology{Nodes: []string{cfg.Join}, Self: -1}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	secretWarning, err := loadSecret(&cfg)
	if err != nil {
		return nil, err
	}
	if secretWarning != "" {
		log.Warn(secretWarning)
	}
	certs, tlsWarning, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	if tlsWarning != "" {
		log.Warn(tlsWarning)
	}
	if err := checkExposure(cfg, topo.Nodes); err != nil {
		return nil, err
	}
	now := time.Now
	if cfg.ClockOffset != 0 {
		now = func() time.Time { return time.Now().Add(cfg.ClockOffset) }
	}
	n := &Node{cfg: cfg, log: log, certs: certs, registry: metrics.NewRegistry(), served: make(chan error, 1), failed: make(chan error, 1), leftCh: make(chan struct{}, 1)}
	var peerTLS *tls.Config
	if certs != nil {
		peerTLS = certs.ClientConfig()
	}
	defer func() {
		if err != nil {
			n.closeStorage()
		}
	}()
	storeOpts := cfg.Store
	storeOpts.Logger, storeOpts.FS = log, cfg.FS
	n.store, err = store.Open(cfg.DataDir, storeOpts)
	if err != nil {
		return nil, lockError(cfg.DataDir, err)
	}
	cmap, self, joined, err := membership.Bootstrap{
		DataDir: cfg.DataDir, Self: cfg.Self, Join: cfg.Join, Topology: topo, Replicas: cfg.Replicas,
		Fetch: func(url string) ([]byte, error) {
			return rpc.FetchMap(url, rpc.PeerOptions{Timeout: cfg.ReplicaTimeout, Secret: cfg.ClusterSecret, Dial: cfg.PeerDial, TLS: peerTLS})
		},
	}.Map(n.store)
	if err != nil {
		return nil, err
	}
	urls := make([]string, len(cmap.Nodes))
	for i, m := range cmap.Nodes {
		urls[i] = m.URL
	}
	if err := checkExposure(cfg, urls); err != nil {
		return nil, err
	}
	if cfg.MaxConnections == 0 {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return nil, fmt.Errorf("descriptor limit, to derive --max-connections: %w", err)
		}
		cfg.MaxConnections = DefaultMaxConnections(lim.Cur, len(cmap.Nodes), cfg.PeerConns)
		n.cfg.MaxConnections = cfg.MaxConnections
	}
	clock, err := hlc.New(self, now)
	if err != nil {
		return nil, err
	}
	clock.SetMaxAhead(cfg.MaxClockSkew)
	if cfg.FS == nil { // a checkpoint of a store elsewhere would not be on the disk
		n.checkpoints = newCheckpoints(n.store)
	}
	// Versions issued after a restart must be newer than every stored one.
	bound, err := n.store.ClockBound()
	if err != nil {
		return nil, err
	}
	if ahead := clock.Restore(bound, n.store.SetClockBound); ahead > hlc.PersistWindow {
		log.Warn("clock restored ahead of the wall clock: it had observed versions from a clock running ahead, or this one stepped back",
			"ahead", ahead)
	} else if ahead > 0 {
		// The last run's window: wait it out, so that versions issued
		// from now on are the wall clock's (see hlc.Clock.Restore).
		time.Sleep(ahead)
	}
	if n.cache, err = cache.New(cfg.CacheBytes); err != nil {
		return nil, err
	}
	n.registry.MustRegister(n.cache.Collector(), n.store.Collector())
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
	local := &replica.Replica{Store: n.store, Cache: n.cache, Versions: replica.NewVersionFilter(replica.DefaultVersionSlots, floor), Clock: clock}
	if err := n.buildCluster(cmap, self, joined, clock, local, peerTLS); err != nil {
		return nil, err
	}
	n.api = &httpapi.Server{
		Coord:  n.coord,
		Status: status{n},
		RPC: &rpc.Server{
			Replica: local, Secret: cfg.ClusterSecret, Log: log,
			Rebuilding: n.rebuild.Rebuilding, ClusterFormed: n.probe.Formed, Maps: n.members,
			RequirePeerCert: certs != nil && certs.Mutual(),
			MaxKeyBytes:     cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes,
		},
		Metrics: httpapi.NewMetrics(n.registry),
		Log:     log,
		Limits: httpapi.Limits{
			MaxKeyBytes: cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes, MaxBatchBytes: cfg.maxBatchBytes(),
			MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
		},
		Started:          time.Now(),
		ScanIdleTimeout:  cfg.WriteTimeout,
		MaxScans:         cfg.MaxScans,
		ScanMinRate:      cfg.ScanMinRate,
		ScanReleaseAfter: cfg.ScanReleaseAfter,
		RawValueMinBytes: cfg.RawValueMinBytes,
	}
	n.srv = &fasthttp.Server{
		Handler:      n.api.Handler,
		ErrorHandler: n.api.ErrorHandler,
		Name:         "dhtkv",
		// Bodies are read by the handlers as they arrive, into buffers
		// that grow with them (httpapi/body.go); fasthttp reads at most
		// 8 KiB ahead. HeaderReceived refuses, before a byte of the body
		// is read, a length over the limit and ambiguous framing
		// (httpapi/framing.go).
		StreamRequestBody:  true,
		HeaderReceived:     n.api.HeaderReceived,
		MaxRequestBodySize: cfg.maxBatchBytes(),
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
	return n, nil
}

// ErrDataDirInUse is returned by New when another process holds the data
// directory's lock: two nodes must never share a directory.
var ErrDataDirInUse = errors.New("in use by another dhtkv process")

// lockError names the reason when opening the store failed because
// another process holds the directory's lock. Pebble takes it with
// fcntl(F_SETLK) on <dir>/LOCK and returns the bare errno (EAGAIN, or
// EACCES on some systems) when another process holds it, which reads as
// "resource temporarily unavailable". A *fs.PathError with the same errno
// is something else: the LOCK file could not be created.
func lockError(dir string, err error) error {
	var pathErr *fs.PathError
	if (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES)) && !errors.As(err, &pathErr) {
		return fmt.Errorf("data directory %s is %w", dir, ErrDataDirInUse)
	}
	return err
}

// Handler is the node's request handler, as its listener serves it: tests
// and benchmarks drive it without a socket.
func (n *Node) Handler() fasthttp.RequestHandler { return n.api.Handler }

// Start builds a node (New) and serves it (Serve).
func Start(cfg Config) (*Node, error) {
	n, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Serve(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Serve opens the public and admin listeners and starts serving; it
// returns once the public listener accepts connections.
func (n *Node) Serve() error {
	cfg := n.cfg
	ln, err := cfg.Listener, error(nil)
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
	}
	n.ln = newLimitListener(ln, cfg.MaxConnections, cfg.MaxConnectionsPerIP, n.certs != nil, n.registry, n.log)
	if n.adminLn = cfg.AdminListener; n.adminLn == nil && cfg.AdminListen != "" {
		if n.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			n.ln.Close()
			return fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
		}
	}
	if n.adminLn != nil {
		mux := admin.Mux(admin.Parts{
			Registry: n.registry, Ready: n.Ready, AntiEntropy: n.ae, Checkpointer: n.checkpointer(),
			Cluster: n.members.Handler(n.admissible), Log: n.log,
		})
		n.adminSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := n.adminSrv.Serve(n.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("admin listener", "err", err)
			}
		}()
	}
	// fasthttp's Shutdown returns at once if Serve has not registered the
	// listener yet, and a Serve that starts later would then run handlers
	// against a closed store. Return only once Serve is accepting.
	ready := &readyListener{Listener: n.ln, ready: make(chan struct{})}
	var served net.Listener = ready
	if n.certs != nil {
		// What fasthttp's ServeTLS does, without the clone of
		// Server.TLSConfig: the listener wraps each connection in a
		// tls.Conn, whose handshake fasthttp runs in the connection's
		// worker within ReadTimeout and WriteTimeout (getNextProto), and
		// RequestCtx.TLSConnectionState finds it. The limit listener
		// underneath still counts every connection until tls.Conn's
		// Close closes it.
		served = tls.NewListener(ready, n.certs.ServerConfig())
	}
	go func() {
		err := n.srv.Serve(served)
		if !n.stopping.Load() {
			// fasthttp's Serve returns only when its listener fails (the
			// limit listener already waits out descriptor exhaustion) or
			// is closed; either way nothing is served any more.
			if err == nil {
				err = errors.New("listener closed")
			}
			err = fmt.Errorf("public listener %s stopped accepting connections: %w", n.ln.Addr(), err)
			n.log.Error("the node no longer serves", "err", err)
			n.failed <- err
		}
		n.served <- err
	}()
	<-ready.ready
	m, self := n.members.Map() // self is -1 if a newer map already put it out
	n.log.Info("dhtkv node started", "listen", n.ln.Addr().String(), "admin", cfg.AdminListen,
		"data_dir", cfg.DataDir, "self", cfg.Self, "node_id", self, "cluster_map", m.String(), "sync", cfg.Store.Sync,
		"version", buildinfo.Version(), "max_connections", cfg.MaxConnections, "max_connections_per_ip", cfg.MaxConnectionsPerIP,
		"tls", tlsMode(n.certs))
	return nil
}

// ErrRebuilding and ErrStopping are why a node is not ready (Ready).
var (
	ErrRebuilding = errors.New("rebuilding: copying this node's share from its peers; its replica is not read until done")
	ErrStopping   = errors.New("shutting down")
)

// Ready reports whether the node should be sent client traffic (the admin
// port's /readyz): nil while its store is open and its replica serves
// reads. Otherwise the reason: ErrRebuilding while it copies its share
// after starting with an empty data directory (package rebuild), or
// ErrStopping once Shutdown or Close began (the store is about to close).
// A node's store is open from New until Shutdown or Close.
func (n *Node) Ready() error {
	switch {
	case n.stopping.Load():
		return ErrStopping
	case n.rebuild.Rebuilding():
		return ErrRebuilding
	}
	return nil
}

// Failed receives an error if the public listener stops accepting
// connections for any reason but Shutdown: the node then serves nothing
// and its owner should stop it (cmd/dhtkv exits non-zero). It is logged
// at error level already.
func (n *Node) Failed() <-chan error { return n.failed }

// Close releases a node that was never served: its coordinator, cache and
// store.
func (n *Node) Close() error {
	n.stopping.Store(true)
	n.closeCluster()
	return n.closeStorage()
}

// Addr is the public listener's address (useful with port 0).
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Members is the node's membership: its cluster map, the changes it
// drives.
func (n *Node) Members() *membership.Service { return n.members }

// CollectGarbage runs one garbage-collection pass now and returns how many
// records it removed (tests; production runs passes on a schedule).
func (n *Node) CollectGarbage() int { return n.gc.Pass() }

// PeerStates returns what the probes found of every peer.
func (n *Node) PeerStates() []probe.PeerState { return n.probe.PeerStates() }

// Rebuilding reports whether the node's replica is still copying its
// share from its peers.
func (n *Node) Rebuilding() bool { return n.rebuild.Rebuilding() }

// AdminAddr is the admin listener's address, or "" without one.
func (n *Node) AdminAddr() string {
	if n.adminLn == nil {
		return ""
	}
	return n.adminLn.Addr().String()
}

// Registry returns the node's metrics registry (what /metrics serves).
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// Shutdown stops accepting connections, waits up to ctx's deadline for
// in-flight requests and background replica calls, then closes the store
// cleanly. It is safe to call once.
func (n *Node) Shutdown(ctx context.Context) error {
	// /readyz answers 503 from now on; the admin listener stays open
	// while the requests in flight finish.
	n.stopping.Store(true)
	// Range streams may run for any time: abort them (their clients see a
	// truncated body) rather than let them hold the shutdown.
	n.api.Close()
	if err := n.srv.ShutdownWithContext(ctx); err != nil {
		n.shutdownAdmin(ctx)
		// Handlers are still running and may use the store: closing it
		// under them would crash them. Leave it to process exit; every
		// acknowledged write is already in the WAL (fsynced with --sync).
		return fmt.Errorf("shutdown http (store left open): %w", err)
	}
	if err := <-n.served; err != nil {
		n.log.Warn("serve", "err", err)
	}
	// Before the store closes: /metrics reads it.
	n.shutdownAdmin(ctx)
	// Stragglers are bounded by the replica timeout.
	n.closeCluster()
	if err := n.closeStorage(); err != nil {
		return err
	}
	n.log.Info("dhtkv node stopped", "listen", n.cfg.Listen)
	return nil
}

// shutdownAdmin stops the admin listener and waits, until ctx ends, for
// its requests in flight (a /metrics scrape reads the store); past that
// it closes their connections.
func (n *Node) shutdownAdmin(ctx context.Context) {
	if n.adminSrv == nil {
		return
	}
	if err := n.adminSrv.Shutdown(ctx); err != nil {
		n.adminSrv.Close()
	}
}

func (n *Node) closeStorage() error {
	n.checkpoints.close()
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
