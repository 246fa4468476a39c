package membership

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures a node's membership. Zero fields take the defaults
// noted (EnsureDefaults).
type Options struct {
	// Dial returns the transport to the member at url, which tells maps
	// what it meets (rpc.PeerOptions.Maps); it is called once per URL
	// for the service's life. Required.
	Dial func(url string, maps rpc.Maps) view.Peer
	// Copy streams partitions whole from a replica of their old set
	// (partcopy.Copier.Copy), and Exchange compares them with the others
	// afterwards (antientropy.Service.Exchange, pulling only): the
	// mover's copy. Both required before Start.
	Copy     Copier
	Exchange Exchanger
	// Installed is called with every view installed, the first at Start
	// (default: nothing); anti-entropy schedules new peers with it.
	Installed func(*view.View)
	// OnLeft is called once, on its own goroutine, when an installed map
	// no longer has this node: it was decommissioned (default: nothing).
	OnLeft func()
	// Rebuilding reports whether this node still copies its share from
	// its peers after starting with an empty data directory (package
	// rebuild; default: never). Meanwhile the node acknowledges no map
	// with a change under way: the change's stage waits until the node
	// holds its partitions of both sets (logged.go, followOnce).
	Rebuilding func() bool
	// Timeout is the deadline of one map exchange with a member, plus a
	// second (the node's --replica-timeout; default 300 ms).
	Timeout time.Duration
	// Log is this node's replica of the cluster map's log (started):
	// changes go through it, and the service installs the maps it
	// applies and acknowledges them (logged.go). Required.
	Log *maplog.Log
	// DropRate is the most records a second this node deletes when it
	// drops the partitions it no longer holds after a change, or records
	// it holds outside its partitions at a start (--drop-rate; default
	// DefaultDropRate). A drop's cost is per record, whatever its size:
	// two point deletes (the record and its index entry), the cache's
	// invalidation, and two tombstones to compact later; unpaced, the
	// quarter of a node's records that a join takes from it went in a
	// burst that held requests for more than a second.
	DropRate int
}

// DefaultDropRate is DropRate's default, in records a second.
const DefaultDropRate = 20000

// DefaultOptions returns the defaults of the fields that have flags.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.DropRate < 0 {
		return fmt.Errorf("--drop-rate %d: must be a positive number of records a second", o.DropRate)
	}
	return nil
}

// RegisterFlags defines the flags of the fields, with their current values
// as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.DropRate, "drop-rate", o.DropRate, "most `records` a second this node deletes when it drops the partitions a membership change took from it, or at a start any record it holds outside its partitions")
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.DropRate == 0 {
		o.DropRate = DefaultDropRate
	}
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
	if o.Installed == nil {
		o.Installed = func(*view.View) {}
	}
	if o.OnLeft == nil {
		o.OnLeft = func() {}
	}
	if o.Rebuilding == nil {
		o.Rebuilding = func() bool { return false }
	}
}

// Service holds this node's cluster map: the view every protocol routes by
// (View), its install behind the epoch gate, the change this node drives
// and the partition moves a map asks of this node. It implements rpc.Maps.
// Its methods are safe for concurrent use.
type Service struct {
	local   *replica.Replica
	selfURL string // this node's URL in the map it started with
	o       Options
	log     *slog.Logger
	m       *metrics
	work    *worker.Group // hand-overs to peers behind
	mover   *mover
	moved   atomic.Uint64 // the last stream stage whose partitions are copied here
	held    atomic.Uint64 // the last epoch whose acknowledgement waited for the rebuild (logged once)
	left    sync.Once
	kick    chan struct{} // wakes follow (logged.go): a copy to report
	stopLog context.CancelFunc
	logDone sync.WaitGroup
	// started is set by Start. A map installed before it (a peer answers
	// the node's start-up pings with a newer one) is only stored: what it
	// asks of the node waits for Start, which acts on the view installed
	// by then. The node builds the parts afterInstall calls (Copy,
	// Exchange, Installed) after the service, so acting earlier would
	// call them before they exist.
	started atomic.Bool

	view      atomic.Pointer[view.View]
	gate      sync.RWMutex // readers: admitted calls; writer: install
	installMu sync.Mutex   // one install at a time
	peersMu   sync.Mutex
	peers     map[string]view.Peer // by URL
	pushMu    sync.Mutex
	pushed    map[string]uint64 // the epoch last handed to a peer, by URL
}

// New returns the membership of node self in map m (stored in local's
// store by the caller), whose replica the moves copy to and drop from.
// Start acts on the map (a change under way, a cleanup pending).
func New(m *clustermap.Map, self int, local *replica.Replica, o Options, log *slog.Logger) (*Service, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Log == nil {
		return nil, errors.New("membership: no cluster map log (Options.Log is required)")
	}
	n := m.Node(self)
	if n == nil {
		return nil, fmt.Errorf("node %d is not in the cluster map (%s)", self, m)
	}
	s := &Service{
		local: local, selfURL: n.URL, o: o, log: log, m: newMetrics(), work: worker.New(),
		peers: map[string]view.Peer{}, pushed: map[string]uint64{}, kick: make(chan struct{}, 1),
		stopLog: func() {},
	}
	s.mover = &mover{s: s, pace: rate.NewLimiter(rate.Limit(o.DropRate), store.DropChunk)}
	s.view.Store(s.newView(m, self))
	s.m.epoch.Set(float64(m.Epoch))
	return s, nil
}

// Limiter is the pace of the drops of partitions a change took away
// (DropRate), for the node's background pace (package pace) to govern.
func (s *Service) Limiter() *rate.Limiter { return s.mover.pace }

// Register adds the instruments to reg.
//
// Besides its own instruments it exports, from the installed map, the
// cluster's size (dhtkv_cluster_members) and the stage of the membership
// change under way (dhtkv_membership_change_stage: 0 none, 1 write-both,
// 2 stream, 3 read-new), so that a dashboard shows a change's progress.
func (s *Service) Register(reg prometheus.Registerer) {
	s.m.register(reg)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_cluster_members",
			Help: "Nodes in the cluster map this node has installed.",
		}, func() float64 { return float64(len(s.View().Map.Nodes)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_membership_change_stage",
			Help: "The stage of the membership change under way in the installed cluster map: 0 none, 1 write-both, 2 stream, 3 read-new.",
		}, func() float64 { return float64(changeStage(s.View().Map.Change)) }),
	)
}

// changeStage numbers a change's stage for dhtkv_membership_change_stage.
func changeStage(c *clustermap.Change) int {
	if c == nil {
		return 0
	}
	switch c.Stage {
	case clustermap.WriteBoth:
		return 1
	case clustermap.Stream:
		return 2
	case clustermap.ReadNew:
		return 3
	}
	return 0
}

// Start does what the installed map asks of this node (afterInstall),
// and from then on what every map installed asks; it then follows the
// log (logged.go).
func (s *Service) Start() {
	s.started.Store(true)
	s.afterInstall(s.View())
	ctx, cancel := context.WithCancel(context.Background())
	s.stopLog = cancel
	s.logDone.Go(func() { s.follow(ctx) })
}

// Close stops following the log, the moves and the hand-overs, then
// closes the peers' transports.
func (s *Service) Close() {
	s.stopLog()
	s.logDone.Wait()
	s.mover.close()
	s.work.Stop()
	s.peersMu.Lock()
	for _, p := range s.peers {
		p.Close()
	}
	s.peersMu.Unlock()
}

// View returns the installed view: the source every protocol routes by.
func (s *Service) View() *view.View { return s.view.Load() }

// Map returns the installed map, and this node's id in it (-1: it left
// the cluster).
func (s *Service) Map() (*clustermap.Map, int) {
	v := s.View()
	return v.Map, v.Self
}

// Moved is the epoch of the last stream stage whose partitions this node
// has copied.
func (s *Service) Moved() uint64 { return s.moved.Load() }

// newView derives the view of m for node self.
func (s *Service) newView(m *clustermap.Map, self int) *view.View {
	return view.New(m, self, s.selfURL, s.peer, time.Now())
}

// peer returns the transport of the member at url, made once per URL for
// the service's life (a node that leaves keeps its idle transport until
// Close: there are at most MaxNodeID+1 of them).
func (s *Service) peer(url string) view.Peer {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	if p := s.peers[url]; p != nil {
		return p
	}
	p := s.o.Dial(url, s)
	s.peers[url] = p
	return p
}

// state is this node's State.
func (s *Service) state() State {
	v := s.View()
	return State{Node: v.Self, Map: v.Map, Moved: s.moved.Load()}
}

// Admit lets a call routed at epoch be served (a peer's batch, a local
// replica call): true unless this node's map is newer; the caller then
// calls Release once it is served. install takes the gate exclusively,
// so no call admitted under one epoch is still being served once the
// next is installed.
func (s *Service) Admit(epoch uint64) bool {
	s.gate.RLock()
	if epoch < s.View().Map.Epoch {
		s.gate.RUnlock()
		return false
	}
	return true
}

// Release ends what Admit admitted.
func (s *Service) Release() { s.gate.RUnlock() }

// Epoch is the installed map's epoch.
func (s *Service) Epoch() uint64 { return s.View().Map.Epoch }

// State answers rpc.MapPath's GET and a refusal's body.
func (s *Service) State() []byte { return s.state().Encode() }

// Offer installs the map of another node's state if it is newer, and
// answers this node's state (rpc.MapPath's POST). What the offer itself
// gets wrong is refused with an *rpc.Error, whose status and one-line
// reason the sender gets: a state that does not parse or holds an
// invalid map (400), one not from a member (403), and a newer map of
// another cluster (409: well-formed and from a node this map knows, but
// it can never be installed here). Only this node's own failure, its
// store refusing to persist the map, is an error of another kind (500).
func (s *Service) Offer(b []byte) ([]byte, error) {
	st, err := ParseState(b)
	if err != nil {
		return nil, &rpc.Error{Status: http.StatusBadRequest, Msg: err.Error()}
	}
	if err := s.fromMember(st); err != nil {
		return nil, &rpc.Error{Status: http.StatusForbidden, Msg: err.Error()}
	}
	if _, err := s.install(st.Map); err != nil {
		if errors.Is(err, ErrOtherCluster) {
			return nil, &rpc.Error{Status: http.StatusConflict, Msg: fmt.Sprintf("cluster map from node %d: %v", st.Node, err)}
		}
		return nil, fmt.Errorf("install the cluster map offered by node %d: %w", st.Node, err)
	}
	return s.State(), nil
}

// fromMember checks that a map comes from a member of this node's map, at
// the URL this node knows it by. Maps are handed over only by members (a
// peer refusing a call, a peer answering behind), and
// the check keeps out a node of another cluster that happens to have the
// same cluster id: one seeded from the same --cluster list, such as a
// process left running from an earlier cluster on the same ports.
func (s *Service) fromMember(st State) error {
	cur := s.View().Map.Node(st.Node)
	sent := st.Map.Node(st.Node)
	if cur == nil || sent == nil || cur.URL != sent.URL {
		return fmt.Errorf("cluster map from node %d, which is not a member of this node's map (%s)", st.Node, s.View().Map)
	}
	return nil
}

// ErrOtherCluster refuses a map of another cluster.
var ErrOtherCluster = errors.New("cluster map of another cluster")

// install makes m this node's map if its epoch is newer than the current
// one's: it is persisted first (a restart resumes from it), then
// published under the gate, then acted on (moves, cleanup, leaving,
// driving). It reports whether m was installed.
func (s *Service) install(m *clustermap.Map) (bool, error) { return s.installMap(m, false) }

// installMap is install; with sameEpoch, a map of the installed epoch
// that differs from the installed one is installed too (the log's map,
// the cluster's truth: see followOnce).
func (s *Service) installMap(m *clustermap.Map, sameEpoch bool) (bool, error) {
	s.installMu.Lock()
	cur := s.View()
	if m.Epoch < cur.Map.Epoch || m.Epoch == cur.Map.Epoch && (!sameEpoch || bytes.Equal(m.Encode(), cur.Map.Encode())) {
		s.installMu.Unlock()
		return false, nil
	}
	if m.Cluster != cur.Map.Cluster {
		s.installMu.Unlock()
		return false, fmt.Errorf("%w: %016x, this node's is %016x", ErrOtherCluster, m.Cluster, cur.Map.Cluster)
	}
	next := s.newView(m, cur.Self)
	if cur.Moving && m.Change == nil {
		// A change ends: the partitions no longer held are dropped
		// (move.go), and a restart must finish that. Their horizons go
		// first, before a later change can give one back while its drop
		// is under way (store.Store.ResetHorizons).
		if err := s.local.Store.ResetHorizons(notHeld(next)); err != nil {
			s.installMu.Unlock()
			return false, err
		}
		if err := s.local.Store.SetCleanupPending(true); err != nil {
			s.installMu.Unlock()
			return false, err
		}
	}
	if !cur.Moving && m.Change != nil {
		// A change begins here: what the partitions this node gains in
		// it hold from before is what arrived before now (move.go,
		// dropLeftovers).
		if err := s.local.Store.SetChangeBegan(uint64(time.Now().UnixMilli())); err != nil {
			s.installMu.Unlock()
			return false, err
		}
	}
	if err := s.local.Store.SetClusterMap(m.Encode()); err != nil {
		s.installMu.Unlock()
		return false, err
	}
	s.gate.Lock()
	s.view.Store(next)
	s.gate.Unlock()
	// A garbage collection decided under the old map either sees next
	// as it commits and withdraws, or is waited for here: nothing it
	// removes commits after this node acknowledges next, on which a
	// change's moves wait (package gc's rule 1).
	s.local.Store.AwaitCommits()
	s.installMu.Unlock()
	s.m.epoch.Set(float64(m.Epoch))
	s.log.Info("cluster map installed", "map", m.String(), "was", cur.Map.Epoch)
	// An install that races Start acts twice on the latest view, which
	// each step of afterInstall takes (a move or cleanup started again).
	if s.started.Load() {
		s.afterInstall(next)
	}
	// follow acknowledges a map installed from a peer as well: this
	// node's replica of the log may lag (its leader out of reach).
	s.wake()
	return true, nil
}

// afterInstall starts what a new view asks of this node.
func (s *Service) afterInstall(v *view.View) {
	switch {
	case v.Self < 0:
		s.leave("this node is no longer in the cluster map (decommissioned, removed, or its id given to a replacement)")
		return
	case v.Dead(v.Self):
		// The cluster counts it dead (dhtkvctl remove asked while it was
		// cut off): it must stop as a dead node would, since what it
		// serves or hands over from now on is no longer waited for.
		s.leave("the cluster map marks this node dead: it is being removed (dhtkvctl remove)")
		return
	}
	s.o.Installed(v)
	s.mover.update(v)
}

// leave runs once when the map no longer has this node, or marks it
// dead; why says which.
func (s *Service) leave(why string) {
	s.left.Do(func() {
		s.log.Warn("membership: " + why + "; stopping")
		go s.o.OnLeft() // not on the installing goroutine: stopping waits for it
	})
}

// Stale installs the map a peer refused a call with.
func (s *Service) Stale(b []byte) {
	st, err := ParseState(b)
	if err != nil {
		s.log.Warn("a peer refused a call as stale with a map that does not parse", "err", err)
		return
	}
	if err := s.fromMember(st); err != nil {
		s.log.Warn("a peer refused a call as stale", "err", err)
		return
	}
	if _, err := s.install(st.Map); err != nil {
		s.log.Warn("install a peer's newer cluster map", "err", err)
	}
}

// Behind hands this node's map to a peer that answered with an older
// epoch, once per peer and epoch, in the background.
func (s *Service) Behind(url string, _ uint64) {
	v := s.View()
	s.pushMu.Lock()
	if s.pushed[url] >= v.Map.Epoch {
		s.pushMu.Unlock()
		return
	}
	s.pushed[url] = v.Map.Epoch
	s.pushMu.Unlock()
	p := s.peer(url)
	s.work.Go(func(context.Context) {
		if _, err := p.Map(s.State(), time.Now().Add(s.o.Timeout+time.Second)); err != nil {
			s.log.Debug("hand the cluster map to a peer behind", "peer", url, "err", err)
			s.pushMu.Lock()
			delete(s.pushed, url) // try again at the next answer
			s.pushMu.Unlock()
		}
	})
}

// Reaches answers another member's question (rpc.ReachPath) whether the
// member at url answers this node: a ping of its own, within Timeout.
func (s *Service) Reaches(url string) (bool, error) {
	v := s.View()
	u, err := clustermap.NormalizeURL(url)
	if err != nil {
		return false, &rpc.Error{Status: http.StatusBadRequest, Msg: err.Error()}
	}
	n := v.Map.ByURL(u)
	switch {
	case v.Self < 0:
		return false, &rpc.Error{Status: http.StatusServiceUnavailable, Msg: "this node is no longer a member of the cluster map"}
	case n == nil:
		return false, &rpc.Error{Status: http.StatusBadRequest, Msg: u + " is not a member of this node's map"}
	case n.ID == v.Self:
		return true, nil
	}
	ok, _ := s.answers(v, n)
	return ok, nil
}

// CleanupPending reports whether this node still has partitions to drop
// after a membership change (move.go).
func (s *Service) CleanupPending() bool {
	pending, err := s.local.Store.CleanupPending()
	return err != nil || pending
}

// metrics are membership's instruments: the installed map's epoch;
// records and bytes copied in for partitions gained; records dropped with
// partitions no longer held.
type metrics struct {
	epoch       prometheus.Gauge
	moveRecords prometheus.Counter
	moveBytes   prometheus.Counter
	moveDropped prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_cluster_map_epoch",
			Help: "The epoch of the cluster map this node has installed.",
		}),
		moveRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_moved_records_total",
			Help: "Records copied to this node for partitions it gained in membership changes.",
		}),
		moveBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_moved_bytes_total",
			Help: "Bytes (records and summaries) exchanged to copy partitions this node gained in membership changes.",
		}),
		moveDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_dropped_records_total",
			Help: "Records deleted with partitions this node no longer holds after membership changes.",
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.epoch, m.moveRecords, m.moveBytes, m.moveDropped)
}
