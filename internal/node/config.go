package node

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dhtkv/dhtkv/internal/admin"
	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/gc"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/settle"
	"github.com/dhtkv/dhtkv/internal/store"
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
	// Admin bounds what a client may make the admin listener hold
	// (admin.Options: --admin-read-timeout, --admin-write-timeout,
	// --admin-idle-timeout, --admin-max-profile). The default value is
	// admin.DefaultOptions().
	Admin admin.Options
	// DataDir is the Pebble directory (--data-dir). The default value is
	// ./data/node1.
	DataDir string

	// CacheBytes is the read cache's capacity in bytes (--cache-bytes); 0
	// disables it. The default value is 64 MiB.
	CacheBytes int64
	// Store configures Pebble (store.Options: --sync, --block-cache-bytes,
	// --memtable-bytes, --l0-compaction-threshold, --wal-min-sync-interval)
	// and the data volume's guard (--min-free-space, --ballast-size). The
	// default value is store.DefaultOptions().
	Store store.Options
	// MemTableSpread spreads the memtable size of the nodes of a cluster
	// (--memtable-spread): a node uses Store.MemTableBytes times a factor
	// between 1-MemTableSpread and 1+MemTableSpread, drawn from a hash of
	// its URL (memTableBytes). Replicas receive the same writes; with
	// memtables of one size they flush, and compact L0, in the same
	// second, and a write then waits for two stalled replicas of three
	// (docs/benchmarks.md, sections 14 and 15). 0: every node uses
	// Store.MemTableBytes. The default value is 0.25.
	MemTableSpread float64

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
	// the largest body (an internal batch, maxBatchBytes: MaxValueBytes +
	// MaxKeyBytes, at least 256 KiB, + 64); 0: no budget. The default
	// value is 256 MiB.
	MaxInflightBodyBytes int64
	// MaxInflightResponseBytes is the budget, in bytes, of the values of
	// RawValueMinBytes or more being sent to clients, held until each is
	// written to its socket (--max-inflight-response-bytes): a GET whose value would take
	// them past it is refused with 503. It must hold the largest value
	// (MaxValueBytes); 0: no budget. The default value is 256 MiB.
	MaxInflightResponseBytes int64

	// ReadTimeout is the time to read a whole request, body included
	// (--read-timeout). The default value is 30 s.
	ReadTimeout time.Duration
	// WriteTimeout is the time to write a whole response; a range stream
	// instead may stall this long between writes (--write-timeout). The
	// default value is 30 s.
	WriteTimeout time.Duration
	// IdleTimeout is how long an idle keep-alive connection stays open
	// (--idle-timeout; 0: ReadTimeout, as fasthttp takes it). The default
	// value is 2 min. ReadTimeout and WriteTimeout must be positive:
	// fasthttp takes zero as no deadline at all.
	IdleTimeout time.Duration
	// LingerTimeout bounds a lingering close (--linger-timeout): a
	// connection closed after an answer that left the request's body
	// unread (413, 503, a malformed request) is half-closed, and what the
	// client still sends is read and dropped for at most this long and
	// at most twice the largest body (2 × (MaxValueBytes + MaxKeyBytes +
	// 64) bytes: room for chunk framing and TLS records), so that the
	// client reads the answer instead of a reset (linger.go).
	// 0: closed at once. The default value is 5 s.
	LingerTimeout time.Duration
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
	// JoinWait is how long a node started with Join waits, polling the
	// member, for the change that adds it (dhtkvctl join or replace), so
	// that it may be started before or after that change (--join-wait).
	// 0: it does not wait, and exits if it is not in the member's map
	// yet. The default value is 10 minutes.
	JoinWait time.Duration
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
	// ClientTokens names the file of the bearer tokens clients must send,
	// each with its role: read, write or admin (--client-tokens; the
	// format is package clientauth's; keep it mode 600). With it every
	// public request but /v0/status and the internal endpoints, and every
	// admin request but /livez, /readyz and /metrics, needs a token whose
	// role allows it (401 without one, 403 with one too low); Reload reads
	// it again. The default value is empty: no client authentication,
	// and then the node serves only loopback addresses (security.go).
	ClientTokens string
	// SnapshotDir is the directory the admin port's /snapshot writes
	// inside, and nowhere else (--snapshot-dir; a request names a new
	// directory in it). The default value is empty, meaning DataDir with
	// "-snapshots" appended: a sibling of the data directory, on the same
	// filesystem, so that Pebble hard-links the sstables instead of
	// copying them.
	SnapshotDir string
	// RestoreOldSnapshot lets the node start on a data directory restored
	// from a snapshot that may lack deletes the other replicas have
	// collected (--restore-old-snapshot; complete as of longer ago than
	// GC.Grace less MaxClockSkew, or not known to be complete:
	// checkRestoredSnapshot), which it refuses otherwise, as it would
	// serve the deleted values again.
	// For restoring every node of a cluster from its snapshots, when
	// nobody holds anything newer. The default value is false.
	RestoreOldSnapshot bool
	// ReplicaTimeout is one request's deadline for its replica calls
	// (--replica-timeout; 504 beyond). The default value is 300 ms.
	ReplicaTimeout time.Duration
	// MaxClockSkew is how far ahead of this node's wall clock a version
	// from another node may be (--max-clock-skew): a replica refuses
	// writes beyond it, and a node whose clock is off from its peers' by
	// more refuses to coordinate writes. The default value is 5 s.
	MaxClockSkew time.Duration
	// Probe configures the pings of the peers and the clock lease
	// (probe.Options: --clock-lease; its MaxClockSkew is MaxClockSkew,
	// its Timeout ReplicaTimeout, its Wall the node's clock). The default
	// value is probe.DefaultOptions().
	Probe probe.Options
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
	// Move configures the bulk copies of partitions into this node when a
	// membership change gives it some or it rebuilds its share
	// (partcopy.Options: --move-rate). The default value is
	// partcopy.DefaultOptions().
	Move partcopy.Options
	// Membership configures this node's cluster membership
	// (membership.Options: --drop-rate, the pace of the drop of the
	// partitions a change took away). Its Dial, Copy, Exchange,
	// Installed, OnLeft and Timeout have no flag: the node sets them (the
	// Timeout is ReplicaTimeout). The default value is
	// membership.DefaultOptions().
	Membership membership.Options
	// Pace slows anti-entropy, hint replay, partition copies and drops
	// while the scheduler's latency says requests wait for the CPU
	// (pace.Options: --background-sched-latency). The default value is
	// pace.DefaultOptions().
	Pace pace.Options
	// MapLog configures the cluster map's Raft log (maplog.Options:
	// --maplog-voters, --maplog-apply-timeout, --maplog-max-pending).
	// The node always opens it, under <data-dir>/maplog, and runs
	// membership on it (docs/membership.md, "The map on a consensus
	// log"): changes are the log's commands, node ids the log's, stages
	// advanced by every member's acknowledgement. Its traffic rides the
	// public port (rpc.LogPath). The default value is
	// maplog.DefaultOptions().
	MapLog maplog.Options
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
	// --gc-rate; Interval has no flag, tests shorten it). The default value is
	// gc.DefaultOptions().
	GC gc.Options
	// Settle configures the settles of the store into its bottom level
	// once it is quiet (settle.Options: --settle-after, --settle-rate;
	// Interval and SliceBytes have no flag, tests shorten them). The
	// default value is settle.DefaultOptions().
	Settle settle.Options
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
	// WallClock, when set, is the wall clock the node's versions are made
	// from and its peers' clocks are measured against, instead of
	// time.Now; ClockOffset is added to it. No flag: the in-process test
	// clusters step a running node's clock with it, as a wrong NTP source
	// or an operator's date command steps a host's, which a fixed
	// ClockOffset set at start cannot show.
	WallClock func() time.Time

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
	// StatFS, when set, reports the data volume's space instead of
	// statfs(2) (store.Options.StatFS; no flag: tests give a node a
	// volume that fills). With FS set and no StatFS, the volume is not
	// guarded: a MemFS has no statfs.
	StatFS func(dir string) (vfs.DiskUsage, error)

	// AccessLog configures the access log (httpapi.AccessLogOptions:
	// --access-log-sample). The default value is
	// httpapi.DefaultAccessLogOptions(): off.
	AccessLog httpapi.AccessLogOptions

	// Logger receives the node's logs. The default value is nil:
	// slog.Default().
	Logger *slog.Logger
	// LogLevel, when set, is the level of Logger's handler, which the
	// admin listener's /log-level reads and changes at run time (no flag:
	// cmd/dhtkv makes it from --log-level). The default value is nil:
	// /log-level answers 501, the level being fixed.
	LogLevel *slog.LevelVar
}

// DefaultConfig returns the defaults Config documents.
func DefaultConfig() Config {
	return Config{
		Listen:                   "127.0.0.1:8080",
		Admin:                    admin.DefaultOptions(),
		DataDir:                  "./data/node1",
		CacheBytes:               64 << 20,
		Store:                    store.DefaultOptions(),
		MemTableSpread:           0.25,
		MaxKeyBytes:              1024,
		MaxValueBytes:            16 << 20,
		MaxHeaderBytes:           8 << 10,
		MaxInflightBodyBytes:     256 << 20,
		MaxInflightResponseBytes: 256 << 20,
		ReadTimeout:              30 * time.Second,
		WriteTimeout:             30 * time.Second,
		IdleTimeout:              2 * time.Minute,
		LingerTimeout:            5 * time.Second,
		MaxConnectionsPerIP:      1024,
		ReplicaTimeout:           300 * time.Millisecond,
		JoinWait:                 10 * time.Minute,
		MaxClockSkew:             hlc.DefaultMaxAhead,
		Probe:                    probe.DefaultOptions(),
		Coordinator:              cluster.DefaultOptions(),
		Handoff:                  handoff.DefaultOptions(),
		AntiEntropy:              antientropy.DefaultOptions(),
		Move:                     partcopy.DefaultOptions(),
		Membership:               membership.DefaultOptions(),
		Pace:                     pace.DefaultOptions(),
		MapLog:                   maplog.DefaultOptions(),
		GC:                       gc.DefaultOptions(),
		Settle:                   settle.DefaultOptions(),
		MaxScans:                 httpapi.DefaultMaxScans,
		ScanMinRate:              httpapi.DefaultScanMinRate,
		PeerConns:                1,
		AccessLog:                httpapi.DefaultAccessLogOptions(),
	}
}

// maxBatchBytes is the largest body of an internal batch: one largest
// write carries its key, the envelope header and framing on top of the
// value; and at least a peer's batch of several writes
// (rpc.DefaultMaxBatchBytes), whatever this node's limits: they are each
// node's flags, and a node whose own are lower (a rolling change of
// them) takes its peers' batches of small writes all the same, refusing
// only the operations over its limits (rpc.Server.ServeBatch).
func (cfg *Config) maxBatchBytes() int {
	return max(cfg.MaxValueBytes+cfg.MaxKeyBytes, rpc.DefaultMaxBatchBytes) + 64
}

// Validate checks the settings that the parts would otherwise misuse: the
// node's own, then each part's (its Options.Validate). The command line
// and New both call it, so a setting is refused in one place.
func (cfg *Config) Validate() error {
	switch {
	case cfg.MaxKeyBytes < 1 || cfg.MaxValueBytes < 0 || cfg.MaxHeaderBytes < 1024:
		return fmt.Errorf("limits: key %d, value %d, header %d bytes: out of range", cfg.MaxKeyBytes, cfg.MaxValueBytes, cfg.MaxHeaderBytes)
	case cfg.ReplicaTimeout <= 0:
		return fmt.Errorf("--replica-timeout must be positive")
	case cfg.ReadTimeout <= 0 || cfg.WriteTimeout <= 0:
		// fasthttp takes zero or less as no deadline at all, and the
		// reads of other nodes' range streams get no idle deadline
		// (rpc.StreamOptions.IdleTimeout) without --write-timeout.
		return fmt.Errorf("--read-timeout %v and --write-timeout %v must be positive", cfg.ReadTimeout, cfg.WriteTimeout)
	case cfg.IdleTimeout < 0:
		return fmt.Errorf("--idle-timeout %v must not be negative (0: --read-timeout)", cfg.IdleTimeout)
	case cfg.MaxScans < 1:
		return fmt.Errorf("--max-scans %d must be at least 1", cfg.MaxScans)
	case cfg.JoinWait < 0:
		return fmt.Errorf("--join-wait must not be negative")
	case cfg.PeerConns < 1:
		return fmt.Errorf("--peer-conns must be at least 1")
	case cfg.MaxClockSkew <= 0:
		return fmt.Errorf("--max-clock-skew must be positive")
	case cfg.LingerTimeout < 0:
		return fmt.Errorf("--linger-timeout must not be negative")
	case cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0:
		return fmt.Errorf("--max-connections and --max-connections-per-ip must not be negative")
	case cfg.MaxInflightBodyBytes < 0 || cfg.MaxInflightBodyBytes > 0 && cfg.MaxInflightBodyBytes < int64(cfg.maxBatchBytes()):
		return fmt.Errorf("--max-inflight-body-bytes %d must be 0 or hold the largest request body, %d bytes (--max-value-bytes + --max-key-bytes, at least 256 KiB, + 64)",
			cfg.MaxInflightBodyBytes, cfg.maxBatchBytes())
	case cfg.MaxInflightResponseBytes < 0 || cfg.MaxInflightResponseBytes > 0 && cfg.MaxInflightResponseBytes < int64(cfg.MaxValueBytes):
		return fmt.Errorf("--max-inflight-response-bytes %d must be 0 or hold the largest value, %d bytes (--max-value-bytes)",
			cfg.MaxInflightResponseBytes, cfg.MaxValueBytes)
	case cfg.MemTableSpread < 0 || cfg.MemTableSpread >= 1:
		return fmt.Errorf("--memtable-spread %v must be in [0, 1)", cfg.MemTableSpread)
	case cfg.SnapshotDir != "" && (within(cfg.SnapshotDir, cfg.DataDir) || within(cfg.DataDir, cfg.SnapshotDir)):
		return fmt.Errorf("--snapshot-dir %s and --data-dir %s: one is inside the other; snapshots go beside the store's files, not among them", cfg.SnapshotDir, cfg.DataDir)
	case cfg.GC.Grace < 0 || cfg.GC.Grace > 0 && cfg.GC.Grace <= cfg.Handoff.Window+cfg.MaxClockSkew:
		return fmt.Errorf("--gc-grace %v must exceed --hint-window %v plus --max-clock-skew %v: a hint still held could otherwise bring back a collected delete", cfg.GC.Grace, cfg.Handoff.Window, cfg.MaxClockSkew)
	case cfg.GC.Rate < 0:
		return fmt.Errorf("--gc-rate %d must not be negative", cfg.GC.Rate)
	}
	for _, v := range []interface{ Validate() error }{&cfg.Admin, &cfg.Store, &cfg.Probe, &cfg.Coordinator, &cfg.Handoff, &cfg.AntiEntropy, &cfg.AccessLog, &cfg.Move, &cfg.Membership, &cfg.Pace, &cfg.MapLog, &cfg.Settle} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// snapshotDir is SnapshotDir, or its default beside DataDir, absolute.
func (cfg *Config) snapshotDir() (string, error) {
	dir := cfg.SnapshotDir
	if dir == "" {
		dir = filepath.Clean(cfg.DataDir) + "-snapshots"
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--snapshot-dir: %w", err)
	}
	return abs, nil
}

// within reports whether path is dir or inside it, compared as absolute,
// clean paths (symbolic links are not followed).
func within(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// gcGrace is GC.Grace, or its default derived from the hint window and
// the clock skew bound (see GC).
func (cfg *Config) gcGrace() time.Duration {
	if cfg.GC.Grace == 0 {
		return cfg.Handoff.Window + cfg.MaxClockSkew + time.Hour
	}
	return cfg.GC.Grace
}

// memTableBytes is the memtable size of the node at url: base times a
// factor in [1-spread, 1+spread), the same at every start of the node (see
// Config.MemTableSpread).
func memTableBytes(base uint64, spread float64, url string) uint64 {
	f := float64(xxhash.Sum64String(url)>>11) / (1 << 53) // [0, 1)
	return uint64(float64(base) * (1 + spread*(2*f-1)))
}
