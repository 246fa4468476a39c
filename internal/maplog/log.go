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
// proposing, watching the map, and the voting group's upkeep).
//
// Only the map goes through the log: the data path stays leaderless.
package maplog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
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
	log   *slog.Logger
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
		o: o, self: self, log: log.With("component", "maplog"), store: st, fsm: newFSM(),
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
	cfg.Logger = newHCLog(l.log)
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

// Propose applies c if this replica leads and returns its result: the
// real outcome, accepted or refused with the reason. On another replica
// it returns a *NotLeaderError naming the leader.
func (l *Log) Propose(ctx context.Context, c Command) (*Result, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
	}
	return l.propose(ctx, b)
}

func (l *Log) propose(ctx context.Context, b []byte) (*Result, error) {
	if len(b) > l.o.MaxCommandBytes {
		return nil, fmt.Errorf("maplog: command of %d bytes over the limit of %d", len(b), l.o.MaxCommandBytes)
	}
	l.propMu.Lock()
	if l.closing {
		l.propMu.Unlock()
		return nil, ErrClosed
	}
	l.proposing.Add(1)
	l.propMu.Unlock()
	defer l.proposing.Done()
	if l.r.State() != raft.Leader {
		return nil, l.notLeader()
	}
	timeout := l.o.ApplyTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	f := l.r.Apply(b, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return nil, l.notLeader()
		}
		return nil, fmt.Errorf("maplog: propose: %w", err)
	}
	res, ok := f.Response().(*Result)
	if !ok {
		return nil, fmt.Errorf("maplog: propose: unexpected response %T", f.Response())
	}
	if err := l.fsm.behindErr(); err != nil {
		// This replica refuses what it can no longer apply (fsm.checkRules)
		// while the others apply it: its answer is not the log's. The
		// outcome stays uncertain; a request sent again with its ID gets
		// the first's from a leader that applies the rules.
		return nil, fmt.Errorf("maplog: propose: %w", err)
	}
	return res, nil
}

func (l *Log) notLeader() error {
	id, addr := l.Leader()
	return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
}

// answerForwarded answers a proposal forwarded by another member.
func (l *Log) answerForwarded(ctx context.Context, b []byte) []byte {
	var c Command
	var rep forwardReply
	if err := json.Unmarshal(b, &c); err != nil {
		rep.Err = fmt.Sprintf("bad command: %v", err)
		out, _ := json.Marshal(rep)
		return out
	}
	relay := c.Relay
	if relay {
		c.Relay = false
		b, _ = json.Marshal(c) // decoded from JSON: encodes
	}
	res, err := l.propose(ctx, b)
	var nl *NotLeaderError
	switch {
	case err == nil:
		rep.Result = res
	case relay && errors.As(err, &nl) && nl.LeaderAddr != "" && l.fwd != nil:
		// One hop only: the command forwarded no longer asks for a relay.
		out, ferr := l.fwd.Forward(ctx, nl.LeaderAddr, b)
		if ferr == nil {
			return out
		}
		rep.Leader, rep.Err = nl.LeaderAddr, fmt.Sprintf("relay to the leader: %v", ferr)
	default:
		if errors.As(err, &nl) {
			rep.Leader = nl.LeaderAddr
		}
		rep.Err = err.Error()
	}
	out, _ := json.Marshal(rep)
	return out
}

// SetPeers tells the log the members of m, the map the node installed:
// Submit goes through them when this replica's configuration does not
// name them. A node added to the group while cut off from the leader has
// no configuration yet and knows no leader: the map it installed (a
// member gave it) is then its only route to the log. A member's address
// is its URL's host:port (Options.AddrFromURL) or the one it registered
// in the log; a member with neither is left out.
func (l *Log) SetPeers(m *clustermap.Map) {
	if m == nil {
		return
	}
	addrs := l.State().Addrs
	peers := make([]Server, 0, len(m.Nodes))
	for _, n := range m.Nodes {
		addr := addrs[n.ID]
		if addr == "" && l.o.AddrFromURL {
			addr = URLAddr(n.URL)
		}
		if addr != "" {
			peers = append(peers, Server{ID: n.ID, Addr: addr})
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = peers
}

// nextRelay is the address of the member after the one at prev (by
// address; the first when prev is ""), of the group's configuration and
// the peers set (SetPeers), skipping this node and the leader; "" when
// there is none, and after the last: a caller that went through every
// member goes to the leader directly again.
func (l *Log) nextRelay(prev string, leader int) string {
	servers, err := l.Configuration()
	if err != nil {
		servers = nil
	}
	var addrs []string
	add := func(id int, addr string) {
		if id != l.self && id != leader && addr != "" && !slices.Contains(addrs, addr) {
			addrs = append(addrs, addr)
		}
	}
	for _, s := range servers {
		if id, ok := nodeOf(s.ID); ok {
			add(id, string(s.Address))
		}
	}
	l.mu.Lock()
	for _, p := range l.peers {
		add(p.ID, p.Addr)
	}
	l.mu.Unlock()
	slices.Sort(addrs)
	for _, a := range addrs {
		if prev == "" || a > prev {
			return a
		}
	}
	return ""
}

// isChange reports whether op changes the map (and so gets an ID).
func isChange(op Op) bool {
	switch op {
	case OpJoin, OpDecommission, OpRemove, OpReplace, OpAbort, OpReplicas, OpSeed:
		return true
	}
	return false
}

// encode is c as the log carries it. A change is given an ID first, so
// that a retry after an uncertain outcome is answered with the first
// attempt's outcome.
func (l *Log) encode(c Command) ([]byte, error) {
	if c.ID == "" && isChange(c.Op) {
		c.ID = requestID()
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
	}
	if len(b) > l.o.MaxCommandBytes {
		return nil, fmt.Errorf("maplog: %s of %d bytes over the limit of %d", c.Op, len(b), l.o.MaxCommandBytes)
	}
	return b, nil
}

// Submit proposes c until the log answers or ctx ends: on a replica that
// does not lead it forwards c to the leader (with a Network), and it
// tries again while there is no leader or the leader loses its office.
// A change is given an ID first, so that a retry after an uncertain
// outcome is answered with the first attempt's outcome.
func (l *Log) Submit(ctx context.Context, c Command) (*Result, error) {
	b, err := l.encode(c)
	if err != nil {
		return nil, err
	}
	wait := max(l.o.HeartbeatTimeout/10, 10*time.Millisecond)
	var relay string   // a member relaying to the leader, "" while it is reached directly
	var relayed []byte // c asking to be relayed
	for {
		res, err := l.propose(ctx, b)
		if err == nil {
			return res, nil
		}
		var nl *NotLeaderError
		switch {
		case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, ErrBehindRules):
			return nil, err // this replica will not answer again
		case errors.As(err, &nl) && l.fwd != nil:
			if nl.LeaderAddr == "" && relay == "" {
				// No leader known here: perhaps only this member lost
				// it (cut from the leader alone). Ask another member.
				relay = l.nextRelay("", nl.LeaderID)
			}
			if relay != "" && relayed == nil {
				rc := c
				rc.Relay = true
				if relayed, err = json.Marshal(rc); err != nil {
					return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
				}
			}
			to, fb := nl.LeaderAddr, b
			if relay != "" {
				to, fb = relay, relayed
			}
			if to == "" {
				break
			}
			out, ferr := l.fwd.Forward(ctx, to, fb)
			var rep forwardReply
			if ferr == nil {
				ferr = json.Unmarshal(out, &rep)
			}
			switch {
			case rep.Result != nil && ferr == nil:
				return rep.Result, nil
			case ferr != nil:
				err = ferr
			default:
				err = errors.New(rep.Err)
			}
			// The leader or the relay is out of reach, or the relay
			// could not reach its leader: go through the next member of
			// the group (it forwards to its leader), and once every
			// member was tried, to the leader directly again. A relay
			// must not be the only route: the member it names may be
			// the one cut off, while the leader is in reach (a member
			// that asked before the election ended, when it knew no
			// leader, and then learned of one).
			relay = l.nextRelay(relay, nl.LeaderID)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: %s not answered: %w (last: %w)", c.Op, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// SubmitVia proposes c through the log at addr, a member's log address:
// the route of a node outside the voting group's configuration (a node
// being joined, registering its address with OpAddr, or one whose
// replica knows no leader yet), which cannot learn the leader from its
// own replica. A member that does not lead answers with the leader's
// address, which the next try goes to; it tries again until the log
// answers or ctx ends. It needs a Forwarder (a Network).
func (l *Log) SubmitVia(ctx context.Context, addr string, c Command) (*Result, error) {
	if l.fwd == nil {
		return nil, errors.New("maplog: no network to reach another member's log")
	}
	b, err := l.encode(c)
	if err != nil {
		return nil, err
	}
	wait := max(l.o.HeartbeatTimeout/10, 10*time.Millisecond)
	to := addr
	for {
		out, err := l.fwd.Forward(ctx, to, b)
		var rep forwardReply
		if err == nil {
			err = json.Unmarshal(out, &rep)
		}
		switch {
		case err != nil:
			to = addr // the leader named may be gone: ask the member again
		case rep.Result != nil:
			return rep.Result, nil
		case rep.Leader != "":
			to, err = rep.Leader, errors.New(rep.Err)
		default:
			to, err = addr, errors.New(rep.Err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: %s through %s not answered: %w (last: %w)", c.Op, addr, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// requestID is a new change's Command.ID: 96 random bits.
func requestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Ack reports that this node installed the map of epoch.
func (l *Log) Ack(ctx context.Context, epoch uint64) (*Result, error) {
	return l.Submit(ctx, Command{Op: OpAck, Node: l.self, Epoch: epoch, Rules: l.fsm.rules})
}

// Copied reports that this node copied its gains at the stream epoch.
func (l *Log) Copied(ctx context.Context, epoch uint64) (*Result, error) {
	return l.Submit(ctx, Command{Op: OpCopied, Node: l.self, Epoch: epoch})
}

// AwaitOutcome waits until the change the request id began has ended
// (completed or aborted), as this replica applies the log.
func (l *Log) AwaitOutcome(ctx context.Context, id string) (*Outcome, error) {
	for {
		s, changed := l.Watch()
		if s.Last != nil && s.Last.ID == id {
			o := *s.Last
			return &o, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: change %s not ended: %w", id, ctx.Err())
		case <-changed:
		}
	}
}

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
	)
	if n, ok := l.fwd.(*Network); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dhtkv_maplog_refused_connections_total",
			Help: "Connections to the cluster map's log port refused for failing authentication.",
		}, func() float64 { return float64(n.Refused()) }))
	}
}

// Configuration returns the voting group's configuration as committed.
func (l *Log) Configuration() ([]raft.Server, error) {
	f := l.r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("maplog: configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}

// AddVoter makes node id at addr a voter (leader only).
func (l *Log) AddVoter(id int, addr string) error {
	return wrapConf("add voter", id, l.r.AddVoter(ServerID(id), raft.ServerAddress(addr), 0, l.o.ApplyTimeout).Error())
}

// AddNonvoter makes node id at addr a non-voter, or updates its address
// (leader only).
func (l *Log) AddNonvoter(id int, addr string) error {
	return wrapConf("add non-voter", id, l.r.AddNonvoter(ServerID(id), raft.ServerAddress(addr), 0, l.o.ApplyTimeout).Error())
}

// step is one change of a voter's suffrage: promote id, or demote it.
type step struct {
	promote bool
	id      int
}

// votingSteps returns the promotions and demotions, in order, that keep k
// healthy voters: while fewer of voters than k are healthy (failing says
// which are not), the candidate (a reachable non-voter that acknowledged
// a map of the log) with the lowest id is promoted; while more than k
// vote, a failing voter is demoted, else the one with the highest id; the
// leader (self) never.
//
// A failing voter is demoted before a candidate takes its place, not
// after: promoted beside it, a candidate that is dead too (its failed
// heartbeats not seen yet) would make a group of k+1 voters of which two
// are down, which for k = 3 has no quorum, for ever; demoted first, the
// failing voter leaves k-1 voters that answer the leader, a quorum of k
// whatever the promoted candidate turns out to be. In that order one
// unseen death (the candidate's) wedges the group; in this one it takes
// two unlikely things at once: the failing voter alive after all (the
// leader alone cut from it for failAfter) and another voter dead unseen.
// Rebalance counts a voter failing only after failAfter and promotes only
// a non-voter with no failed heartbeat, so that members lost together (a
// rack) are all suspected before any step.
func votingSteps(voters, candidates []int, failing func(int) bool, k, self int) []step {
	voters = slices.Clone(voters)
	var out []step
	healthy := func() int {
		n := 0
		for _, id := range voters {
			if !failing(id) {
				n++
			}
		}
		return n
	}
	demote := func(failingOnly bool) bool {
		victim := -1
		for _, id := range voters {
			if failing(id) && id != self {
				victim = id
				break
			}
		}
		if victim < 0 && !failingOnly {
			for _, id := range slices.Backward(voters) {
				if id != self {
					victim = id
					break
				}
			}
		}
		if victim < 0 {
			return false
		}
		out = append(out, step{id: victim})
		voters = slices.DeleteFunc(voters, func(id int) bool { return id == victim })
		return true
	}
	for _, c := range candidates {
		if healthy() >= k {
			break
		}
		if len(voters) >= k {
			demote(true)
		}
		out = append(out, step{promote: true, id: c})
		voters = append(voters, c)
	}
	for len(voters) > k && demote(false) {
	}
	return out
}

// Demote makes voter id a non-voter (leader only).
func (l *Log) Demote(id int) error {
	return wrapConf("demote", id, l.r.DemoteVoter(ServerID(id), 0, l.o.ApplyTimeout).Error())
}

// Remove takes node id out of the group (leader only). A removed node's
// vote requests are refused by every member (hashicorp/raft refuses a
// candidate not in its configuration), so it cannot disrupt the group.
func (l *Log) Remove(id int) error {
	return wrapConf("remove", id, l.r.RemoveServer(ServerID(id), 0, l.o.ApplyTimeout).Error())
}

// failAfter is how long the leader's heartbeats to a voter fail before
// the voter counts as failing (Rebalance): two heartbeat timeouts, so that
// one failed heartbeat does not demote a live voter, and a non-voter that
// died with it has failed heartbeats of its own by then.
func (l *Log) failAfter() time.Duration { return 2 * l.o.HeartbeatTimeout }

// departGrace is how long a leader keeps replicating to a server the map
// left out before it removes it from the group: ten heartbeats, ample for
// a live follower to receive the entries it lacks; a dead one counts that
// much longer.
func (l *Log) departGrace() time.Duration { return 10 * l.o.HeartbeatTimeout }

func wrapConf(what string, id int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("maplog: %s node %d: %w", what, id, err)
}

// maintain runs the leader's upkeep of the voting group: after every map
// change, leadership change or heartbeat news, and every
// RebalanceInterval.
func (l *Log) maintain() {
	t := time.NewTicker(l.o.RebalanceInterval)
	defer t.Stop()
	for {
		_, changed := l.Watch()
		select {
		case <-l.stop:
			return
		case <-changed:
		case o := <-l.obsCh:
			l.mu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				if _, ok := l.failing[d.PeerID]; !ok {
					l.failing[d.PeerID] = time.Now()
				}
			case raft.ResumedHeartbeatObservation:
				delete(l.failing, d.PeerID)
			case raft.LeaderObservation:
				clear(l.failing) // a new leader's heartbeats tell afresh
			}
			l.mu.Unlock()
		case <-t.C:
		}
		if !l.IsLeader() {
			continue
		}
		if l.Behind() != nil {
			// Its map stopped where its rules did: it must not shape the
			// group by it, nor answer proposals. Another voter leads.
			if err := l.r.LeadershipTransfer().Error(); err != nil {
				l.log.Warn("maplog: hand the office over (this replica is behind the log's rules)", "err", err)
			}
			continue
		}
		if err := l.Rebalance(); err != nil && !errors.Is(err, raft.ErrNotLeader) {
			l.log.Warn("maplog: rebalance the voting group", "err", err)
		}
	}
}

// Rebalance makes the group's configuration follow the map (leader only):
// a node that left the map leaves the group, a member with a log address
// joins it as a non-voter, and the voters are kept at voterCount, healthy
// ones replacing those the leader's heartbeats fail to reach
// (votingSteps). A leader that left the map hands its office to another
// voter first.
func (l *Log) Rebalance() error {
	st := l.State()
	if st.Map == nil {
		return nil
	}
	servers, err := l.Configuration()
	if err != nil {
		return err
	}
	l.mu.Lock()
	suspect := maps.Clone(l.failing)
	l.mu.Unlock()
	now := time.Now()
	// A voter counts as failing once the leader's heartbeats have failed
	// for failAfter; a non-voter is a candidate only while none fails.
	// So two members that die together are both suspected before either
	// step is taken: the voter is not replaced by the other dead one.
	failing := func(id int) bool {
		since, ok := suspect[ServerID(id)]
		return ok && now.Sub(since) >= l.failAfter()
	}
	inConf := map[int]raft.Server{}
	departing := map[raft.ServerID]bool{}
	for _, s := range servers {
		id, ok := nodeOf(s.ID)
		if !ok || st.Map.Node(id) == nil {
			if s.ID == ServerID(l.self) {
				return l.r.LeadershipTransfer().Error()
			}
			// A node the map left out (a decommission's last map) learns
			// it from its replica of the log: removed at once, it may not
			// have received that entry yet (a commit needs a quorum, not
			// every member), and it would never learn it is out. So the
			// leader keeps replicating to it for departGrace first, as a
			// non-voter: its vote must not count (it stops once it
			// learns, and a quorum of a group with a stopped voter in it
			// is one failure closer to lost).
			departing[s.ID] = true
			if s.Suffrage == raft.Voter {
				if err := l.r.DemoteVoter(s.ID, 0, l.o.ApplyTimeout).Error(); err != nil {
					return fmt.Errorf("maplog: demote %s, not in the map: %w", s.ID, err)
				}
			}
			l.mu.Lock()
			since, seen := l.departed[s.ID]
			if !seen {
				l.departed[s.ID], since = now, now
			}
			l.mu.Unlock()
			if now.Sub(since) < l.departGrace() {
				continue
			}
			if err := l.r.RemoveServer(s.ID, 0, l.o.ApplyTimeout).Error(); err != nil {
				return fmt.Errorf("maplog: remove %s, not in the map: %w", s.ID, err)
			}
			continue
		}
		inConf[id] = s
	}
	l.mu.Lock()
	for id := range l.departed {
		if !departing[id] {
			delete(l.departed, id)
		}
	}
	l.mu.Unlock()
	for _, n := range st.Map.Nodes {
		addr := st.Addrs[n.ID]
		if addr == "" && l.o.AddrFromURL {
			addr = URLAddr(n.URL)
		}
		if addr == "" {
			continue
		}
		if s, ok := inConf[n.ID]; ok && string(s.Address) == addr {
			continue
		}
		if s, ok := inConf[n.ID]; ok && s.Suffrage == raft.Voter {
			// A replaced node's new address: keep its vote.
			if err := l.AddVoter(n.ID, addr); err != nil {
				return err
			}
		} else if err := l.AddNonvoter(n.ID, addr); err != nil {
			return err
		}
		inConf[n.ID] = raft.Server{ID: ServerID(n.ID), Address: raft.ServerAddress(addr), Suffrage: inConf[n.ID].Suffrage}
	}
	var voters, candidates []int
	for _, id := range sortedIDs(inConf) {
		s := inConf[id]
		switch {
		case s.Suffrage == raft.Voter:
			voters = append(voters, id)
		case suspect[s.ID].IsZero() && st.Acks[id] > 0:
			// A non-voter is promoted only once it has acknowledged a map
			// of the log (it runs and follows it): a leader just elected
			// has no heartbeat failures on record yet, and promoting a
			// joined node not started would make four voters of which
			// two are down, a group without a quorum while a voter is
			// dead (TestMembershipLeaderKilledMidChangeResumes).
			candidates = append(candidates, id)
		}
	}
	for _, st := range votingSteps(voters, candidates, failing, voterCount(l.o.Voters, len(inConf)), l.self) {
		var err error
		if st.promote {
			err = l.AddVoter(st.id, string(inConf[st.id].Address))
		} else {
			err = l.Demote(st.id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
