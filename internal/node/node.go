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
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/admin"
	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/clientauth"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/gc"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/rebuild"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/settle"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

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
	members *membership.Service
	coord   *cluster.Coordinator
	probe   *probe.Prober
	hints   *handoff.Handoff
	ae      *antientropy.Service
	gc      *gc.Collector
	settle  *settle.Settler
	pace    *pace.Governor
	// streamPace paces the partition streams this node sends
	// (rpc.Server.StreamPace).
	streamPace *rate.Limiter
	// lateBatches counts the batches refused for arriving after their
	// sender's deadline (rpc.DeadlineHeader).
	lateBatches prometheus.Counter
	rebuild     *rebuild.Rebuilder
	identity    *identity // the data directory's (claimIdentity)
	// settings are this node's settings every node must share
	// (settings.go).
	settings string
	streams  *rpc.StreamClient
	// The cluster map's log (maplog.go); logConns takes its connections
	// from the public port.
	mapLog   *maplog.Log
	logConns *rpc.LogListener
	stopSeed context.CancelFunc
	seedDone sync.WaitGroup
	registry *prometheus.Registry
	api      *httpapi.Server
	certs    *tlsconf.Certs     // nil without TLS
	tokens   *clientauth.Tokens // nil without client authentication

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
func New(cfg Config) (*Node, error) { return NewContext(context.Background(), cfg) }

// NewContext is New, whose waits at start-up (a node started with --join
// before the change that adds it, Config.JoinWait) end when ctx does.
func NewContext(ctx context.Context, cfg Config) (_ *Node, err error) {
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
	if err := checkClientExposure(cfg); err != nil {
		return nil, err
	}
	tokens, tokensWarning, err := loadTokens(cfg)
	if err != nil {
		return nil, err
	}
	if tokensWarning != "" {
		log.Warn(tokensWarning)
	}
	snapshotDir, err := cfg.snapshotDir()
	if err != nil {
		return nil, err
	}
	cfg.SnapshotDir = snapshotDir
	now := time.Now
	if cfg.WallClock != nil {
		now = cfg.WallClock
	}
	if off := cfg.ClockOffset; off != 0 {
		wall := now
		now = func() time.Time { return wall().Add(off) }
	}
	n := &Node{cfg: cfg, log: log, certs: certs, tokens: tokens, registry: metrics.NewRegistry(), served: make(chan error, 1), failed: make(chan error, 1), leftCh: make(chan struct{}, 1), settings: cfg.sharedSettings()}
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
	storeOpts.Logger, storeOpts.FS, storeOpts.StatFS = log, cfg.FS, cfg.StatFS
	storeOpts.MemTableBytes = memTableBytes(cfg.Store.MemTableBytes, cfg.MemTableSpread, cfg.Self)
	storeOpts.BallastLater = true // once the directory is found this node's (buildCluster)
	n.store, err = store.Open(cfg.DataDir, storeOpts)
	if err != nil {
		return nil, lockError(cfg.DataDir, err)
	}
	cmap, self, joined, err := membership.Bootstrap{
		DataDir: cfg.DataDir, Self: cfg.Self, Join: cfg.Join, Topology: topo, Listed: cfg.Cluster != "", Replicas: cfg.Replicas,
		Fetch: func(url string) ([]byte, error) {
			return rpc.FetchMap(url, rpc.PeerOptions{Timeout: cfg.ReplicaTimeout, Secret: cfg.ClusterSecret, Dial: cfg.PeerDial, TLS: peerTLS})
		},
		Wait: cfg.JoinWait, Ctx: ctx, Log: log,
	}.Map(n.store)
	if err != nil {
		return nil, err
	}
	restored, err := n.checkRestoredSnapshot(len(cmap.Nodes))
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
		n.checkpoints = newCheckpoints(markedCheckpoints{n})
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
	registerClock(n.registry, clock)
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
	if err := n.buildCluster(cmap, self, joined, topo, clock, local, peerTLS); err != nil {
		return nil, err
	}
	// The directory is this node's: claimIdentity accepted it.
	n.store.MakeBallast()
	if restored {
		if err := n.store.ForgetSnapshot(); err != nil {
			n.closeCluster()
			return nil, err
		}
	}
	n.api = &httpapi.Server{
		Coord:  n.coord,
		Status: status{n},
		RPC: &rpc.Server{
			Replica: local, Secret: cfg.ClusterSecret, Log: log,
			Incarnation: incarnation(),
			FormedAt:    func() time.Time { return n.identity.get().FormedAt },
			Settings:    n.settings,
			Rebuilding:  n.rebuild.Rebuilding, ClusterFormed: n.probe.Formed, Maps: n.members,
			LogConns:        n.logConns,
			RequirePeerCert: certs != nil && certs.Mutual(),
			MaxKeyBytes:     cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes,
			StreamPace: n.streamPace,
			Late:       n.lateBatches,
		},
		Metrics: httpapi.NewMetrics(n.registry),
		Log:     log,
		Limits: httpapi.Limits{
			MaxKeyBytes: cfg.MaxKeyBytes, MaxValueBytes: cfg.MaxValueBytes, MaxBatchBytes: cfg.maxBatchBytes(),
			MaxInflightBodyBytes: cfg.MaxInflightBodyBytes, MaxInflightResponseBytes: cfg.MaxInflightResponseBytes,
		},
		Started:          time.Now(),
		ScanIdleTimeout:  cfg.WriteTimeout,
		MaxScans:         cfg.MaxScans,
		ScanMinRate:      cfg.ScanMinRate,
		ScanReleaseAfter: cfg.ScanReleaseAfter,
		RawValueMinBytes: cfg.RawValueMinBytes,
		Tokens:           tokens,
		AccessLog:        cfg.AccessLog,
	}
	n.api.RPC.HoldAnswer = n.api.HoldAnswer // large internal answers share the GETs' budget
	n.api.Register(n.registry)
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
func Start(cfg Config) (*Node, error) { return StartContext(context.Background(), cfg) }

// StartContext is Start, whose waits at start-up end when ctx does
// (NewContext).
func StartContext(ctx context.Context, cfg Config) (_ *Node, err error) {
	// The listeners first: a port that is taken fails the start before the
	// data directory is opened, so a node that cannot serve leaves no map,
	// identity or store behind (a retry with other flags then starts as
	// new, not on what the failed start wrote).
	var bound []net.Listener
	defer func() {
		if err != nil {
			for _, ln := range bound {
				ln.Close()
			}
		}
	}()
	// An address the node would refuse to serve without tokens is refused
	// before it is bound: on an address this machine does not have, the
	// bind's error would otherwise hide the reason (New checks it again).
	if err := checkClientExposure(cfg); err != nil {
		return nil, err
	}
	if cfg.Listener == nil {
		if cfg.Listener, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
		bound = append(bound, cfg.Listener)
	}
	if cfg.AdminListener == nil && cfg.AdminListen != "" {
		if cfg.AdminListener, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			return nil, fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
		}
		bound = append(bound, cfg.AdminListener)
	}
	n, err := NewContext(ctx, cfg)
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
	n.ln.lingerTimeout, n.ln.lingerBytes = cfg.LingerTimeout, 2*int64(cfg.maxBatchBytes())
	if n.adminLn = cfg.AdminListener; n.adminLn == nil && cfg.AdminListen != "" {
		if n.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			n.ln.Close()
			return fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
		}
	}
	if n.adminLn != nil {
		ao := cfg.Admin
		ao.EnsureDefaults()
		n.adminLn = newAdminLimitListener(n.adminLn, ao.MaxConnections, n.registry, n.log)
		mux := admin.Mux(admin.Parts{
			Registry: n.registry, Ready: n.Ready, AntiEntropy: n.ae, Checkpointer: n.checkpointer(),
			Cluster: n.members.Handler(n.admissible), SnapshotDir: cfg.SnapshotDir, Tokens: n.tokens, LogLevel: cfg.LogLevel, Log: n.log, MaxProfile: cfg.Admin.MaxProfile,
		})
		n.adminSrv = admin.NewServer(mux, cfg.Admin)
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
		// Close closes it. A plain HTTP request gets a 400 that says
		// the port speaks TLS (plainhttp.go).
		served = newTLSListener(ready, n.certs.ServerConfig(), n.log)
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
			n.fail(err)
		}
		n.served <- err
	}()
	<-ready.ready
	m, self := n.members.Map() // self is -1 if a newer map already put it out
	n.log.Info("dhtkv node started", "listen", n.ln.Addr().String(), "admin", cfg.AdminListen,
		"data_dir", cfg.DataDir, "self", cfg.Self, "node_id", self, "cluster_map", m.String(), "sync", cfg.Store.Sync,
		"memtable_bytes", memTableBytes(cfg.Store.MemTableBytes, cfg.MemTableSpread, cfg.Self),
		"version", buildinfo.Version(), "max_connections", cfg.MaxConnections, "max_connections_per_ip", cfg.MaxConnectionsPerIP,
		"tls", tlsMode(n.certs), "client_tokens", n.tokens != nil)
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
// ErrStopping once Shutdown or Close began (the store is about to close),
// or the store's failure (store.ErrStoreFailed: a write or sync failed,
// and it takes no writes until a restart), or ErrNoQuorum while some
// partition has fewer than a majority of its replicas reachable from
// here (quorum.go). A volume below --min-free-space leaves the node
// ready: it serves reads, and a client's write it refuses with 507 goes
// to another node (the client fails over).
// A node's store is open from New until Shutdown or Close.
func (n *Node) Ready() error {
	switch {
	case n.stopping.Load():
		return ErrStopping
	case n.rebuild.Rebuilding():
		return ErrRebuilding
	}
	if err := n.store.Failure(); err != nil {
		return err
	}
	if why := n.quorumProblem(); why != "" {
		return fmt.Errorf("%w: %s", ErrNoQuorum, why)
	}
	return nil
}

// Failed receives an error if the public listener stops accepting
// connections for any reason but Shutdown (the node then serves nothing),
// or if the node's replica of the cluster map's log finds the log's rules
// above its release's (maplog.ErrBehindRules: it can no longer follow
// the map's changes). Its owner should stop it (cmd/dhtkv exits
// non-zero). It is logged at error level already.
func (n *Node) Failed() <-chan error { return n.failed }

// fail reports err on Failed; only the first failure is kept.
func (n *Node) fail(err error) {
	select {
	case n.failed <- err:
	default:
	}
}

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
func (n *Node) CollectGarbage() int { return n.gc.Pass(context.Background()) }

// AntiEntropy returns anti-entropy's state with every peer, its last
// exchange's figures included (tests; operators see it in /v0/status).
func (n *Node) AntiEntropy() []antientropy.PeerSync { return n.ae.Status() }

// PeerStates returns what the probes found of every peer.
func (n *Node) PeerStates() []probe.PeerState { return n.probe.PeerStates() }

// Rebuilding reports whether the node's replica is still copying its
// share from its peers.
func (n *Node) Rebuilding() bool { return n.rebuild.Rebuilding() }

// Unconfirmed reports whether the node, started with an empty data
// directory while not every peer answered, has yet to learn whether it
// lost its disk (package rebuild).
func (n *Node) Unconfirmed() bool { return n.rebuild.Unconfirmed() }

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

// incarnation draws the name of this run of the node (rpc.Server.Incarnation):
// random, never 0.
func incarnation() uint64 {
	for {
		if i := rand.Uint64(); i != 0 {
			return i
		}
	}
}
