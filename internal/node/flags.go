package node

import (
	"flag"

	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

// RegisterFlags defines every flag of a node's configuration, with cfg's
// current values as defaults (DefaultConfig's, for cmd/dhtkv): the
// node's own here, and each part's by its Options.RegisterFlags, beside
// the code that reads them. Config.Validate checks what they set.
func (cfg *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "public API address `host:port`")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "Pebble data `directory`")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin `host:port` for /debug/pprof/, /metrics, /livez, /readyz, /repair, /snapshot, /cluster and /log-level (off when empty; non-loopback needs --client-tokens)")
	cfg.Admin.RegisterFlags(fs)
	sizeflag.Var(fs, &cfg.CacheBytes, "cache-bytes", "read cache capacity, a `size` (64MiB, 1GB, bytes; 0 disables the cache)")
	cfg.Store.RegisterFlags(fs)
	fs.Float64Var(&cfg.MemTableSpread, "memtable-spread", cfg.MemTableSpread, "each node's memtable is --memtable-bytes times a factor within ±this fraction, fixed per node by its URL, so that replicas do not flush and compact in the same second (0: all the same)")
	sizeflag.Var(fs, &cfg.MaxKeyBytes, "max-key-bytes", "longest key, a `size` (400 beyond)")
	sizeflag.Var(fs, &cfg.MaxValueBytes, "max-value-bytes", "largest value, a `size` (413 beyond)")
	sizeflag.Var(fs, &cfg.MaxHeaderBytes, "max-header-bytes", "largest request line + headers, a `size`")
	sizeflag.Var(fs, &cfg.MaxInflightBodyBytes, "max-inflight-body-bytes", "budget of the buffers holding the bodies of requests in flight, a `size`; a body beyond gets 503 (0: no budget)")
	sizeflag.Var(fs, &cfg.MaxInflightResponseBytes, "max-inflight-response-bytes", "budget of the values of 16 KiB or more being sent to clients, and of other nodes' batch answers over 256 KiB, each held until written to its socket, a `size`; a GET or a batch beyond gets 503 (0: no budget)")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "time to read a whole request")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "time to write a whole response")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "keep-alive idle time before a connection is closed")
	fs.DurationVar(&cfg.LingerTimeout, "linger-timeout", cfg.LingerTimeout, "after an answer that leaves the request's body unread (413, 503, 400), the most time spent reading and dropping what the client still sends, at most twice the largest body, before closing, so that it reads the answer rather than a reset (0: close at once)")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most client `connections` open at once, peers' included; beyond, 503 and closed (0: the descriptor limit less a reserve for Pebble and peers, see README)")
	fs.IntVar(&cfg.MaxConnectionsPerIP, "max-connections-per-ip", cfg.MaxConnectionsPerIP, "most `connections` open at once from one address; beyond, 429 and closed (0: no cap; behind a proxy every client has its address)")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "comma-separated `URLs` of all nodes, the same list on every node; seeds the cluster map at the first start only (empty: a cluster of one)")
	fs.StringVar(&cfg.Join, "join", cfg.Join, "a member's `URL`: take the cluster map from it at the first start, once dhtkvctl join or replace added this node (before or after this start: see --join-wait)")
	fs.DurationVar(&cfg.JoinWait, "join-wait", cfg.JoinWait, "how long a node started with --join waits for the change that adds it before it gives up (0: not at all)")
	fs.StringVar(&cfg.Self, "self", cfg.Self, "this node's `URL` in --cluster (default http://<listen>)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", cfg.ClusterSecret, "shared `secret` required on node-to-node requests (403 without it); visible to other local users in ps: prefer --cluster-secret-file")
	fs.StringVar(&cfg.ClusterSecretFile, "cluster-secret-file", cfg.ClusterSecretFile, "`file` holding the shared secret, one line (mode 600); without a secret or --peer-tls-ca every address must be loopback")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM `file` of this node's certificate chain, leaf first: the public listener then speaks only TLS, to clients and nodes, and this node calls the others over TLS (all nodes or none; reread on SIGHUP)")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM `file` of --tls-cert's private key (mode 600; reread on SIGHUP)")
	fs.StringVar(&cfg.PeerTLSCA, "peer-tls-ca", cfg.PeerTLSCA, "PEM `file` of the CA certificates node certificates chain to: mutual TLS between nodes, internal endpoints 403 without a client certificate from it; --tls-cert must then allow serverAuth and clientAuth (reread on SIGHUP)")
	fs.StringVar(&cfg.ClientTokens, "client-tokens", cfg.ClientTokens, "`file` of client bearer tokens, one a line: ROLE TOKEN, the role read, write or admin (mode 600; reread on SIGHUP); requests then need a token of their role (401, 403); without it every --listen and --admin-listen address must be loopback")
	fs.BoolVar(&cfg.RestoreOldSnapshot, "restore-old-snapshot", cfg.RestoreOldSnapshot, "start on a data directory restored from a snapshot that may lack deletes the others have collected (complete as of longer ago than --gc-grace less --max-clock-skew, or not known to be complete), refused otherwise as this node would bring them back: for restoring every node of a cluster from its snapshots")
	fs.StringVar(&cfg.SnapshotDir, "snapshot-dir", cfg.SnapshotDir, "`directory` the admin port's /snapshot writes inside, and nowhere else (default <data-dir>-snapshots)")
	fs.DurationVar(&cfg.ReplicaTimeout, "replica-timeout", cfg.ReplicaTimeout, "deadline of one request's replica calls (dial, write, read)")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", cfg.MaxClockSkew, "how far ahead of this node's clock another node's versions may be; a node further off from its peers refuses to coordinate writes")
	cfg.Probe.RegisterFlags(fs)
	cfg.Coordinator.RegisterFlags(fs)
	cfg.Handoff.RegisterFlags(fs)
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replication factor: nodes that keep each partition, the default and largest from; seeds the cluster map (0: the --cluster size)")
	cfg.AntiEntropy.RegisterFlags(fs)
	cfg.Move.RegisterFlags(fs)
	cfg.Membership.RegisterFlags(fs)
	cfg.Pace.RegisterFlags(fs)
	cfg.MapLog.RegisterFlags(fs)
	fs.IntVar(&cfg.MaxScans, "max-scans", cfg.MaxScans, "range `streams` in flight, public and internal together; beyond, 429")
	sizeflag.Var(fs, &cfg.ScanMinRate, "scan-min-rate", "slowest a range stream's client may read, a `size` per second: a piece of n bytes must be taken within 5s + n/rate, else the stream is aborted (0: no minimum)")
	cfg.GC.RegisterFlags(fs)
	cfg.Settle.RegisterFlags(fs)
	cfg.AccessLog.RegisterFlags(fs)
	fs.IntVar(&cfg.PeerConns, "peer-conns", cfg.PeerConns, "batches in flight to each peer at once, for reads and for writes each (one connection each)")
}
