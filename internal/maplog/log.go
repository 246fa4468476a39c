// Package maplog keeps the cluster map on a Raft log (hashicorp/raft):
// every membership change, every node id and every stage advance is an
// entry of one log, applied in the same order on every member, so that
// two changes asked at once are serialized (one accepted, the other
// refused with the map it lost to) and never silently dropped
// (docs/membership.md, "The map on a consensus log").
//
// The pieces: Store (the log, vote and snapshots, in a Pebble instance of
// their own), the FSM's rules (fsm.go: every change a compare-and-set on
// the map's epoch, ids given by the log, a stage advanced only by the
// acknowledgements of every member of it), Network (a raft.StreamLayer
// whose connections authenticate both ends, and which carries proposals
// forwarded to the leader) and Log (this file: opening, starting,
// watching the map, its instruments; submit.go: proposals, forwarded
// and retried until the log answers; group.go: the voting group kept
// at 3 or 5 as the map changes).
//
// Only the map goes through the log: the data path stays leaderless.
package maplog

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	neturl "net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// Options configures a node's log. Zero fields take the defaults the
// fields document.
type Options struct {
	// Voters is the size of the voting group (--maplog-voters; 3 or 5,
	// default 3). With fewer members every member votes, rounded down to
	// an odd number; the other members follow the log as non-voters.
	Voters int
	// HeartbeatTimeout and ElectionTimeout are raft's (default 1 s each):
	// how long a follower goes without the leader before it stands.
	HeartbeatTimeout, ElectionTimeout time.Duration
	// LeaderLeaseTimeout is how long a leader keeps office without
	// reaching a quorum (default 500 ms; at most HeartbeatTimeout).
	LeaderLeaseTimeout time.Duration
	// CommitTimeout is how long the leader waits before it heartbeats
	// an entry's commit (default 50 ms).
	CommitTimeout time.Duration
	// ApplyTimeout bounds how long a proposal waits to be committed and
	// applied (--maplog-apply-timeout; default 10 s).
	ApplyTimeout time.Duration
	// SnapshotThreshold is how many entries past the last snapshot make
	// the next one (default 1024), TrailingLogs how many entries a
	// snapshot leaves in the log for followers that lag (default 1024).
	SnapshotThreshold, TrailingLogs uint64
	// SnapshotInterval is how often the threshold is checked (default
	// 30 s).
	SnapshotInterval time.Duration
	// RetainSnapshots is how many snapshots are kept (default 2).
	RetainSnapshots int
	// MaxSnapshotBytes bounds a snapshot a peer may send (default 64 MiB;
	// a map of 256 nodes is about 30 KiB).
	MaxSnapshotBytes int64
	// MaxCommandBytes bounds a command, proposed or forwarded (default
	// 1 MiB).
	MaxCommandBytes int
	// HandshakeTimeout bounds a connection's authentication (default 5 s).
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections handshaking or being answered at
	// once (--maplog-max-pending; default 64).
	MaxPending int
	// RebalanceInterval is how often the leader checks the voting group
	// besides after every change (default 2 s).
	RebalanceInterval time.Duration
	// AddrFromURL makes a member's log address its node URL's host:port
	// (URLAddr) when the log records none for it (State.Addrs): the
	// node's log rides its HTTP port (rpc.LogPath), so every member is
	// reachable where its URL says. False: only recorded addresses.
	AddrFromURL bool
}

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	var o Options
	o.EnsureDefaults()
	return o
}

// EnsureDefaults sets every zero field to its default.
func (o *Options) EnsureDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.Voters <= 0 {
		o.Voters = 3
	}
	def(&o.HeartbeatTimeout, time.Second)
	def(&o.ElectionTimeout, time.Second)
	def(&o.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&o.CommitTimeout, 50*time.Millisecond)
	def(&o.ApplyTimeout, 10*time.Second)
	def(&o.SnapshotInterval, 30*time.Second)
	def(&o.HandshakeTimeout, 5*time.Second)
	def(&o.RebalanceInterval, 2*time.Second)
	if o.SnapshotThreshold == 0 {
		o.SnapshotThreshold = 1024
	}
	if o.TrailingLogs == 0 {
		o.TrailingLogs = 1024
	}
	if o.RetainSnapshots <= 0 {
		o.RetainSnapshots = 2
	}
	if o.MaxSnapshotBytes <= 0 {
		o.MaxSnapshotBytes = 64 << 20
	}
	if o.MaxCommandBytes <= 0 {
		o.MaxCommandBytes = 1 << 20
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 64
	}
}

// Validate checks the options as EnsureDefaults would complete them
// (zero fields take their defaults).
func (o *Options) Validate() error {
	d := *o
	d.EnsureDefaults()
	o = &d
	if o.Voters != 3 && o.Voters != 5 {
		return fmt.Errorf("--maplog-voters %d: want 3 or 5", o.Voters)
	}
	if o.LeaderLeaseTimeout > o.HeartbeatTimeout {
		return fmt.Errorf("maplog: leader lease %v exceeds the heartbeat timeout %v", o.LeaderLeaseTimeout, o.HeartbeatTimeout)
	}
	return nil
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Voters, "maplog-voters", o.Voters, "members that vote on the cluster map's log (3 or 5); the others follow it")
	fs.DurationVar(&o.ApplyTimeout, "maplog-apply-timeout", o.ApplyTimeout, "how long a membership change waits for the log to commit it")
	fs.IntVar(&o.MaxPending, "maplog-max-pending", o.MaxPending, "connections to the cluster map's log handshaking or being answered at once; more are closed")
}

// voterCount is how many of n members vote: Voters, or n if fewer,
// rounded down to an odd number (an even group tolerates no more
// failures than the odd one below it, and needs one more for a quorum).
func voterCount(voters, n int) int {
	k := min(voters, n)
	if k > 1 && k%2 == 0 {
		k--
	}
	return k
}

// URLAddr is the log address of the node at url when the log rides the
// node's HTTP port: the URL's host:port ("" if url does not parse).
func URLAddr(url string) string {
	u, err := neturl.Parse(url)
	if err != nil {
		return ""
	}
	return u.Host
}

// ServerID is the raft id of node id: its map id in decimal.
func ServerID(id int) raft.ServerID { return raft.ServerID(strconv.Itoa(id)) }

func nodeOf(s raft.ServerID) (int, bool) {
	id, err := strconv.Atoi(string(s))
	return id, err == nil
}

// NotLeaderError is a proposal made on a member that is not the leader.
// LeaderAddr is the leader's log address, empty while none is known.
type NotLeaderError struct {
	LeaderID   int
	LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddr == "" {
		return "maplog: not the leader, and no leader is known now"
	}
	return fmt.Sprintf("maplog: not the leader; the leader is node %d at %s", e.LeaderID, e.LeaderAddr)
}

// Log is one node's replica of the cluster map's log. Open opens its
// stores; Start starts raft; Close stops it.
type Log struct {
	o     Options
	self  int
	log   *slog.Logger // component=maplog
	base  *slog.Logger // the node's, for raft's adapter (component=maplog.raft)
	store *Store
	fsm   *fsm
	trans raft.Transport
	fwd   Forwarder // nil: proposals are not forwarded
	r     *raft.Raft

	obsCh chan raft.Observation
	obs   *raft.Observer
	stop  chan struct{}
	wg    sync.WaitGroup

	// Proposals in flight, which Close lets finish before it stops raft:
	// hashicorp/raft answers no future it committed but had not applied
	// when it shut down, so a proposal waiting on one then (a forwarded
	// one, answered by a Network goroutine that the transport's Close
	// waits for) would hang the close for ever.
	propMu    sync.Mutex
	closing   bool // guarded by propMu: proposals are refused
	proposing sync.WaitGroup

	mu      sync.Mutex
	failing map[raft.ServerID]time.Time // peers the leader's heartbeats fail to reach, since when
	// departed is when this leader first found each server of its
	// configuration absent from the map (Rebalance removes it departGrace
	// later).
	departed map[raft.ServerID]time.Time
	// peers are the members the node knows of from its installed map
	// (SetPeers): relays besides the replica's configuration.
	peers []Server
}

// Open opens the log of node self under dir on fs (a Pebble instance
// of its own; vfs.Default, or vfs.NewMem in tests). trans carries raft's
// RPCs (NewTCPTransport over a Network, or raft's in-memory transport in
// tests); fwd, when set, carries proposals forwarded to the leader (the
// Network, which is closed with the log). It
// starts nothing.
func Open(fs vfs.FS, dir string, self int, trans raft.Transport, fwd Forwarder, o Options, log *slog.Logger) (*Log, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	st, err := OpenStore(fs, dir, o.RetainSnapshots, o.MaxSnapshotBytes, log)
	if err != nil {
		return nil, err
	}
	return &Log{
		o: o, self: self, log: log.With("component", "maplog"), base: log, store: st, fsm: newFSM(),
		trans: trans, fwd: fwd, stop: make(chan struct{}),
		failing:  map[raft.ServerID]time.Time{},
		departed: map[raft.ServerID]time.Time{},
	}, nil
}

// NewTCPTransport is raft's network transport over n, without
// pipelined replication (noPipeline).
func NewTCPTransport(n *Network, log *slog.Logger) raft.Transport {
	return noPipeline{raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  n,
		MaxPool: 3,
		Timeout: 10 * time.Second,
		Logger:  newHCLog(log),
	})}
}

// noPipeline is a network transport that refuses pipelined replication,
// so raft replicates one AppendEntries at a time. hashicorp/raft v1.8.0's
// pipeline reads a follower's address (followerReplication.peer) without
// the lock under which a configuration change writes it: a replace,
// which gives a voter a new address, is a data race there (found by
// -race in the node's tests). A map log's entries are few and small: the
// pipeline's throughput is not needed.
type noPipeline struct{ *raft.NetworkTransport }

func (noPipeline) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// HasState reports whether the log was started before (it has a term, an
// entry or a snapshot): a node with state never bootstraps again.
func (l *Log) HasState() (bool, error) {
	return raft.HasExistingState(l.store, l.store, l.store)
}

// Start starts raft: the latest snapshot is restored into the map at
// once, the entries after it are applied once a leader confirms them.
func (l *Log) Start() error {
	cfg := raft.DefaultConfig()
	cfg.LocalID = ServerID(l.self)
	cfg.HeartbeatTimeout = l.o.HeartbeatTimeout
	cfg.ElectionTimeout = l.o.ElectionTimeout
	cfg.LeaderLeaseTimeout = l.o.LeaderLeaseTimeout
	cfg.CommitTimeout = l.o.CommitTimeout
	cfg.SnapshotThreshold = l.o.SnapshotThreshold
	cfg.TrailingLogs = l.o.TrailingLogs
	cfg.SnapshotInterval = l.o.SnapshotInterval
	cfg.Logger = newHCLog(l.base)
	r, err := raft.NewRaft(cfg, l.fsm, l.store, l.store, l.store, l.trans)
	if err != nil {
		return fmt.Errorf("maplog: start raft: %w", err)
	}
	l.r = r
	if l.fwd != nil {
		l.fwd.ServeForwarded(l.answerForwarded)
	}
	l.obsCh = make(chan raft.Observation, 64)
	l.obs = raft.NewObserver(l.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation, raft.PeerObservation:
			return true
		}
		return false
	})
	r.RegisterObserver(l.obs)
	l.wg.Go(l.maintain)
	return nil
}

// Server is a member of the voting group's configuration.
type Server struct {
	ID   int
	Addr string
}

// Bootstrap makes the group's first configuration of a new cluster:
// the servers (every seed, each bootstrapping with the same list, which
// hashicorp/raft requires) by id, the first voterCount of them voters and
// the rest non-voters. A log with state ignores it: bootstrap happens
// once, whatever the restarts.
func (l *Log) Bootstrap(servers []Server) error {
	servers = slices.Clone(servers)
	slices.SortFunc(servers, func(a, b Server) int { return a.ID - b.ID })
	k := voterCount(l.o.Voters, len(servers))
	var conf raft.Configuration
	for i, s := range servers {
		suffrage := raft.Nonvoter
		if i < k {
			suffrage = raft.Voter
		}
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: suffrage, ID: ServerID(s.ID), Address: raft.ServerAddress(s.Addr)})
	}
	if i := slices.IndexFunc(servers, func(s Server) bool { return s.ID == l.self }); i < 0 || i >= k {
		// Only voters bootstrap (raft refuses a non-voter); a non-voter
		// waits for the leader to reach it.
		return nil
	}
	err := l.r.BootstrapCluster(conf).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("maplog: bootstrap: %w", err)
	}
	return nil
}

// ErrClosed refuses a proposal made while the log closes.
var ErrClosed = errors.New("maplog: the log is closing")

// closeDrain bounds how long Close waits for the proposals in flight
// before it stops raft: a leader that cannot commit steps down within
// LeaderLeaseTimeout, which answers them.
const closeDrain = 5 * time.Second

// Close stops raft and closes the stores and the network. It first
// refuses new proposals and lets those in flight end while raft still
// runs (see Log.proposing).
func (l *Log) Close() error {
	var errs []error
	l.propMu.Lock()
	l.closing = true
	l.propMu.Unlock()
	drained := make(chan struct{})
	go func() { l.proposing.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(closeDrain):
		l.log.Warn("maplog: closing with proposals still waiting for raft", "waited", closeDrain)
	}
	if l.r != nil {
		close(l.stop)
		l.wg.Wait()
		l.r.DeregisterObserver(l.obs)
		if i, ok := l.fwd.(interface{ Interrupt() }); ok {
			i.Interrupt() // raft's RPCs in flight fail now, not at their timeout
		}
		if err := l.r.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("maplog: shut raft down: %w", err))
		}
	}
	if c, ok := l.trans.(raft.WithClose); ok {
		errs = append(errs, c.Close())
	}
	if c, ok := l.fwd.(interface{ Close() error }); ok {
		errs = append(errs, c.Close())
	}
	errs = append(errs, l.store.Close())
	return errors.Join(errs...)
}

// State returns the log's state as this replica has applied it.
func (l *Log) State() *State {
	s, _ := l.fsm.current()
	return s
}

// Map returns the map as this replica has applied it (nil before the
// seed).
func (l *Log) Map() *clustermap.Map { return l.State().Map }

// Watch returns the state and a channel closed once a newer state is
// applied.
func (l *Log) Watch() (*State, <-chan struct{}) { return l.fsm.current() }

// Leader returns the leader's node id and log address (-1, "" when none
// is known).
func (l *Log) Leader() (int, string) {
	addr, id := l.r.LeaderWithID()
	n, ok := nodeOf(id)
	if !ok || addr == "" {
		return -1, ""
	}
	return n, string(addr)
}

// OnBehind makes fn be called once, with an ErrBehindRules error, if this
// replica finds the log's rules in force above its release's: it then
// applies no more of the log (fsm.checkRules), and its node must stop.
// Set it before Start (a snapshot restored at Start can find it); fn runs
// on raft's goroutine and must not block.
func (l *Log) OnBehind(fn func(error)) {
	l.fsm.mu.Lock()
	defer l.fsm.mu.Unlock()
	l.fsm.onBehind = fn
}

// Behind is the ErrBehindRules error once this replica found the log's
// rules above its release's, else nil.
func (l *Log) Behind() error { return l.fsm.behindErr() }

// IsLeader reports whether this replica leads.
func (l *Log) IsLeader() bool { return l.r.State() == raft.Leader }

// Register adds the log's instruments to reg: what an operator needs to
// tell a healthy group (docs/membership.md). Call it once, after Start.
//
//   - dhtkv_maplog_leader: 1 while this replica leads;
//   - dhtkv_maplog_voters: voters in the configuration this replica has
//     (the group's size; below the target, a voter is missing);
//   - dhtkv_maplog_applied_index: the last entry applied here (replicas
//     far behind the leader's are lagging);
//   - dhtkv_maplog_last_contact_seconds: time since this follower last
//     heard from a leader (0 on the leader, -1 before any contact);
//   - dhtkv_maplog_unreachable_peers: members this leader's heartbeats
//     fail to reach now (0 on a follower): what to alert on while one is
//     down, raft's log saying so once per half minute (repeatWindow);
//   - dhtkv_maplog_refused_connections_total: connections to the log's
//     port refused for failing authentication (with a Network).
func (l *Log) Register(reg prometheus.Registerer) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("dhtkv_maplog_leader", "1 while this node leads the cluster map's log.", func() float64 {
			if l.IsLeader() {
				return 1
			}
			return 0
		}),
		gauge("dhtkv_maplog_voters", "Voters in the cluster map's log configuration as this node has it.", func() float64 {
			servers, err := l.Configuration()
			if err != nil {
				return 0
			}
			v := 0
			for _, s := range servers {
				if s.Suffrage == raft.Voter {
					v++
				}
			}
			return float64(v)
		}),
		gauge("dhtkv_maplog_applied_index", "The last entry of the cluster map's log applied on this node.", func() float64 {
			return float64(l.r.AppliedIndex())
		}),
		gauge("dhtkv_maplog_last_contact_seconds", "Seconds since this node last heard from the log's leader (0 on the leader; -1 before any contact).", func() float64 {
			if l.IsLeader() {
				return 0
			}
			t := l.r.LastContact()
			if t.IsZero() {
				return -1
			}
			return time.Since(t).Seconds()
		}),
		gauge("dhtkv_maplog_unreachable_peers", "Members of the cluster map's log whose heartbeats from this node, leading it, fail now (0 on a follower).", func() float64 {
			if !l.IsLeader() {
				return 0
			}
			servers, err := l.Configuration()
			if err != nil {
				return 0
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			n := 0
			for _, s := range servers {
				// A server removed while failing stays in failing.
				if _, ok := l.failing[s.ID]; ok {
					n++
				}
			}
			return float64(n)
		}),
	)
	if n, ok := l.fwd.(*Network); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dhtkv_maplog_refused_connections_total",
			Help: "Connections to the cluster map's log port refused for failing authentication.",
		}, func() float64 { return float64(n.Refused()) }))
	}
}
