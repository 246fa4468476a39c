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

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/admin"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/metrics"
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
	// BlockCacheBytes is Pebble's block cache in bytes
	// (--block-cache-bytes). The default value is 64 MiB.
	BlockCacheBytes int64
	// MemTableBytes is one Pebble memtable in bytes (--memtable-bytes); up
	// to store.MemTableStopWrites of them are in memory. The default value
	// is 16 MiB.
	MemTableBytes uint64
	// Sync makes an acknowledged write durable: the WAL is fsynced before
	// the answer (--sync). The default value is true.
	Sync bool
	// L0CompactionThreshold is how many L0 sublevels trigger a compaction
	// into the level below; writes stall at four times as many
	// (--l0-compaction-threshold, see store.Options). The default value is
	// 16.
	L0CompactionThreshold int

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
	// ReadRepair is what a GET does with the stale replicas it finds:
	// blocking (write the newest record to them before replying), async
	// (in the background) or off (--read-repair, see cluster/repair.go).
	// The default value is blocking.
	ReadRepair string
	// HintWindow is how old a hint (a write kept for a replica that
	// missed it) may get before it is dropped (--hint-window). The default
	// value is 3 h.
	HintWindow time.Duration
	// HintMaxBytes caps the hints kept for one replica, in bytes
	// (--hint-max-bytes). The default value is 256 MiB.
	HintMaxBytes int64
	// HintReplayRate is the most hint bytes per second delivered to
	// returning replicas (--hint-replay-rate). The default value is 4 MiB.
	HintReplayRate int64
	// HintInterval is how often hints are offered to their replicas. The
	// default value is 1 s; tests shorten it.
	HintInterval time.Duration
	// Replicas is the replication factor: how many nodes keep each
	// partition, the default and largest from of a request (--replicas).
	// It seeds the cluster map, which keeps it from then on. The default
	// value is 0: the size of the --cluster list.
	Replicas int
	// AEInterval is how often this node compares its data with each peer
	// (--ae-interval; 0: only on demand). The default value is 1 h.
	AEInterval time.Duration
	// AERate is the most record bytes a second anti-entropy pulls and
	// pushes (--ae-rate). The default value is 8 MiB.
	AERate int64
	// AEConcurrency is how many peers anti-entropy compares at once
	// (--ae-concurrency). The default value is 1.
	AEConcurrency int
	// MaxScans bounds the range streams in flight, public and internal
	// (--max-scans; 429 beyond). The default value is 64.
	MaxScans int
	// ScanMinRate is the slowest a range stream's client may read, in
	// bytes per second (--scan-min-rate; a piece of n bytes must be taken
	// within 5 s + n/rate; 0: no minimum, only WriteTimeout between
	// pieces). The default value is 16 KiB.
	ScanMinRate int64
	// GCGrace is how long a tombstone or an expired value is kept at
	// least, from its delete or expiry, before garbage collection may
	// remove it (--gc-grace); it must exceed HintWindow plus MaxClockSkew.
	// The default value is 0: HintWindow + MaxClockSkew + 1 h (4 h 5 s
	// with their defaults).
	GCGrace time.Duration
	// GCInterval is how often garbage collection looks for what it may
	// remove. The default value is 1 min; tests shorten it.
	GCInterval time.Duration
	// ReadHedgeDelay is the least time a GET waits for its first ack
	// replicas before asking the others (--read-hedge-delay; 0 asks all at
	// once). The default value is 5 ms.
	ReadHedgeDelay time.Duration
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
		MaxInflightBodyBytes:  256 << 20,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		MaxConnectionsPerIP:   1024,
		ReplicaTimeout:        300 * time.Millisecond,
		MaxClockSkew:          hlc.DefaultMaxAhead,
		ReadRepair:            "blocking",
		HintWindow:            3 * time.Hour,
		HintMaxBytes:          256 << 20,
		HintReplayRate:        4 << 20,
		HintInterval:          time.Second,
		AEInterval:            time.Hour,
		AERate:                8 << 20,
		AEConcurrency:         1,
		MaxScans:              httpapi.DefaultMaxScans,
		ScanMinRate:           httpapi.DefaultScanMinRate,
		GCInterval:            time.Minute,
		ReadHedgeDelay:        5 * time.Millisecond,
		PeerConns:             1,
	}
}

// maxBatchBytes is the largest body of an internal batch: one largest
// write carries its key, the envelope header and framing on top of the
// value.
func (cfg *Config) maxBatchBytes() int { return cfg.MaxValueBytes + cfg.MaxKeyBytes + 64 }

// validate checks the settings that the parts would otherwise misuse.
func (cfg *Config) validate() error {
	switch {
	case cfg.MaxKeyBytes < 1 || cfg.MaxValueBytes < 0 || cfg.MaxHeaderBytes < 1024:
		return fmt.Errorf("limits: key %d, value %d, header %d bytes: out of range", cfg.MaxKeyBytes, cfg.MaxValueBytes, cfg.MaxHeaderBytes)
	case cfg.ReplicaTimeout <= 0:
		return fmt.Errorf("--replica-timeout must be positive")
	case cfg.PeerConns < 1:
		return fmt.Errorf("--peer-conns must be at least 1")
	case cfg.MaxClockSkew <= 0:
		return fmt.Errorf("--max-clock-skew must be positive")
	case cfg.ReadHedgeDelay < 0:
		return fmt.Errorf("--read-hedge-delay must not be negative")
	case cfg.MemTableBytes == 0:
		return fmt.Errorf("--memtable-bytes must be positive")
	case cfg.L0CompactionThreshold < 1:
		return fmt.Errorf("--l0-compaction-threshold must be at least 1")
	case cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0:
		return fmt.Errorf("--max-connections and --max-connections-per-ip must not be negative")
	case cfg.MaxInflightBodyBytes < 0 || cfg.MaxInflightBodyBytes > 0 && cfg.MaxInflightBodyBytes < int64(cfg.maxBatchBytes()):
		return fmt.Errorf("--max-inflight-body-bytes %d must be 0 or hold the largest request body, %d bytes (--max-value-bytes + --max-key-bytes + 64)",
			cfg.MaxInflightBodyBytes, cfg.maxBatchBytes())
	}
	return nil
}

// Node is one dhtkv server. New builds it without opening any socket;
// Serve (or Start, which does both) puts it on its listeners.
//
// Lifetime: a node made by New owns its store until Close (never served)
// or Shutdown (served); either is called once.
type Node struct {
	cfg      Config
	log      *slog.Logger
	store    *store.Store
	cache    *cache.Cache
	coord    *cluster.Coordinator
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
	topo, err := cluster.ParseTopology(cfg.Cluster, cfg.Self)
	if err != nil {
		return nil, err
	}
	if cfg.Join != "" {
		if cfg.Join, err = membership.NormalizeURL(cfg.Join); err != nil {
			return nil, fmt.Errorf("--join: %w", err)
		}
		topo = cluster.Topology{Nodes: []string{cfg.Join}, Self: -1}
	}
	if err := cfg.validate(); err != nil {
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
	if cfg.GCGrace == 0 {
		cfg.GCGrace = cfg.HintWindow + cfg.MaxClockSkew + time.Hour
	}
	if cfg.GCGrace <= cfg.HintWindow+cfg.MaxClockSkew {
		return nil, fmt.Errorf("--gc-grace %v must exceed --hint-window %v plus --max-clock-skew %v: a hint still held could otherwise bring back a collected delete", cfg.GCGrace, cfg.HintWindow, cfg.MaxClockSkew)
	}
	repair, err := cluster.ParseRepairMode(cfg.ReadRepair)
	if err != nil {
		return nil, fmt.Errorf("--read-repair: %w", err)
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
	n.store, err = store.Open(cfg.DataDir, store.Options{
		Sync: cfg.Sync, L0CompactionThreshold: cfg.L0CompactionThreshold, BlockCacheBytes: cfg.BlockCacheBytes, MemTableBytes: cfg.MemTableBytes, Logger: log,
		FS: cfg.FS,
	})
	if err != nil {
		return nil, lockError(cfg.DataDir, err)
	}
	cmap, self, joined, err := n.clusterMap(topo, peerTLS)
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
	local := &replica.Replica{Store: n.store, Cache: n.cache, Versions: replica.NewVersionFilter(replica.DefaultVersionSlots, floor)}
	n.coord, err = cluster.NewCoordinator(cmap, self, clock, local, cluster.Options{
		Timeout:      cfg.ReplicaTimeout,
		HedgeDelay:   cfg.ReadHedgeDelay,
		ReadRepair:   repair,
		MaxClockSkew: cfg.MaxClockSkew,
		// A range stream may run for any time; the write timeout then
		// bounds a stall instead of the whole response.
		ScanIdleTimeout: cfg.WriteTimeout,
		MaxKeyBytes:     cfg.MaxKeyBytes,
		MaxValueBytes:   cfg.MaxValueBytes,
		Peer: rpc.PeerOptions{
			Timeout: cfg.ReplicaTimeout, Conns: cfg.PeerConns, Secret: cfg.ClusterSecret, Dial: cfg.PeerDial, TLS: peerTLS,
			// Peers run with the same limits: a batch stays within their
			// request body limit below.
			MaxBatchBytes: min(256<<10, cfg.maxBatchBytes()),
		},
		OnLeft: n.left,
		Handoff: cluster.HandoffOptions{
			Window: cfg.HintWindow, MaxBytes: cfg.HintMaxBytes, ReplayRate: cfg.HintReplayRate,
			Interval: cfg.HintInterval,
		},
		AntiEntropy: cluster.AntiEntropyOptions{
			Interval: aeInterval(cfg.AEInterval), Rate: cfg.AERate, Concurrency: cfg.AEConcurrency,
		},
		GC: cluster.GCOptions{Grace: cfg.GCGrace, Interval: cfg.GCInterval},
	}, n.registry, log)
	if err != nil {
		return nil, err
	}
	if err := n.claimIdentity(cmap, self, joined); err != nil {
		n.coord.Close()
		return nil, err
	}
	n.api = &httpapi.Server{
		Coord: n.coord,
		RPC: &rpc.Server{
			Replica: local, Clock: clock, Secret: cfg.ClusterSecret, Log: log,
			Rebuilding: n.coord.Rebuilding, ClusterFormed: n.coord.Formed, Map: n.coord.MapHooks(),
			MaxKeyBytes: cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes,
		},
		Metrics: httpapi.NewMetrics(n.registry),
		Log:     log,
		Limits: httpapi.Limits{
			MaxKeyBytes: cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes, MaxBatchBytes: cfg.maxBatchBytes(),
			MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
		},
		Started:         time.Now(),
		ScanIdleTimeout: cfg.WriteTimeout,
		MaxScans:        cfg.MaxScans,
		ScanMinRate:     scanMinRate(cfg.ScanMinRate),
		RequirePeerCert: certs != nil && certs.Mutual(),
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

// claimIdentity checks that the data directory is this node's, and gives
// an empty one its identity. A directory of another cluster, or of another
// node of this one, is refused: serving it would mix two datasets. An
// empty directory while a peer holds data is a wiped or replaced disk: the
// node rebuilds its share before serving reads (cluster/rebuild.go), and
// resumes a rebuild a stop interrupted.
//
// A node that joined (--join) is given its identity whole: formed, and
// rebuilding unless it is the node a join change adds (which gets its
// partitions by the change's stream stage): a replacement.
func (n *Node) claimIdentity(m *membership.Map, self int, joined bool) error {
	want := store.Identity{Cluster: m.Cluster, Node: self}
	id, ok, err := n.store.Identity()
	if err != nil {
		return err
	}
	if ok && (id.Cluster != want.Cluster || id.Node != want.Node) {
		return fmt.Errorf("data directory %s belongs to node %d of cluster %016x; this is node %d of cluster %016x (the --cluster list changed?)",
			n.cfg.DataDir, id.Node, id.Cluster, want.Node, want.Cluster)
	}
	if !ok {
		has, err := n.store.HasData()
		if err != nil {
			return err
		}
		// A directory with data but no identity was written by an
		// earlier release: it is adopted as it is.
		switch {
		case joined:
			want.Formed = true
			ch := m.Change
			want.Rebuilding = !has && (ch == nil || ch.Kind != membership.Join || ch.Node != self)
		default:
			want.Rebuilding = !has && len(m.Nodes) > 1 && n.coord.ClusterFormed()
		}
		if err := n.store.SetIdentity(want); err != nil {
			return err
		}
		id = want
	}
	// The identity is written by one goroutine at a time: the rebuild's
	// end and the probe's first full round may meet.
	var mu sync.Mutex
	cur := id
	update := func(change func(*store.Identity)) error {
		mu.Lock()
		defer mu.Unlock()
		next := cur
		change(&next)
		if err := n.store.SetIdentity(next); err != nil {
			return err
		}
		cur = next
		return nil
	}
	n.coord.SetFormed(id.Formed, func() error { return update(func(i *store.Identity) { i.Formed = true }) })
	if id.Rebuilding {
		n.coord.StartRebuild(func() error { return update(func(i *store.Identity) { i.Rebuilding = false }) })
	}
	return nil
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
		mux := http.NewServeMux()
		mux.Handle("/", admin.Handler(n.registry, n.Ready))
		mux.Handle("/repair", admin.RepairHandler(
			func(ctx context.Context) any {
				res := n.coord.Repair(ctx)
				if res == nil {
					return nil // the client went away
				}
				out := make([]client.Exchange, len(res))
				for i, x := range res {
					out[i] = client.Exchange{
						Peer: x.Peer, Started: x.Started, DurationSeconds: x.Duration.Seconds(),
						Partitions: x.Partitions, PartitionsDiffering: x.PartitionsDiffering, SegmentsDiffering: x.SegmentsDiffering,
						Pulled: x.Pulled, Pushed: x.Pushed, Failed: x.Failed,
						SummaryBytes: x.SummaryBytes, RecordBytes: x.RecordBytes, Error: x.Err,
					}
				}
				return out
			},
			func() any { return n.coord.AntiEntropy() }))
		mux.Handle("/snapshot", admin.SnapshotHandler(n.checkpointer(), n.log))
		mux.Handle("/cluster", n.clusterHandler())
		mux.Handle("/cluster/", n.clusterHandler())
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
	m, self := n.coord.Map() // self is -1 if a newer map already put it out
	n.log.Info("dhtkv node started", "listen", n.ln.Addr().String(), "admin", cfg.AdminListen,
		"data_dir", cfg.DataDir, "self", cfg.Self, "node_id", self, "cluster_map", m.String(), "sync", cfg.Sync,
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
// after starting with an empty data directory (cluster/rebuild.go), or
// ErrStopping once Shutdown or Close began (the store is about to close).
// A node's store is open from New until Shutdown or Close.
func (n *Node) Ready() error {
	switch {
	case n.stopping.Load():
		return ErrStopping
	case n.coord.Rebuilding():
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
	n.coord.Close()
	return n.closeStorage()
}

// Addr is the public listener's address (useful with port 0).
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Coordinator is the node's cluster coordinator (tests drive anti-entropy
// and garbage collection through it).
func (n *Node) Coordinator() *cluster.Coordinator { return n.coord }

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
	n.coord.Close()
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

// aeInterval maps --ae-interval to cluster.AntiEntropyOptions: 0 there
// means the default, here "only on demand".
func aeInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// scanMinRate maps --scan-min-rate to httpapi.Server.ScanMinRate: 0 there
// means the default, here no minimum.
func scanMinRate(r int64) int64 {
	if r == 0 {
		return -1
	}
	return r
}
