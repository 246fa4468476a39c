package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// Coordinator runs client requests against a key's replicas. The node that
// receives a request coordinates it.
//
// Shape of one request (Get and Write share it, see fanOut):
//
//  1. placement picks the key's first `from` replicas;
//  2. each remote replica's call is started (view.Go: queued on the peer's
//     batching lanes, no goroutine per call) and comes back on a channel
//     of the request's, with room for every call, so that a call that
//     ends after the coordinator has answered never blocks its sender
//     (writes call all `from` replicas at once; reads call `ack` of them
//     first and the others on a failure or after --read-hedge-delay, see
//     fanOut);
//  3. the local replica, if in the set, is served in-process on the
//     calling goroutine while the remote calls are in flight;
//  4. the coordinator returns as soon as `ack` replicas have answered, or as
//     soon as so many failed that `ack` is out of reach;
//  5. stragglers are received in the background by one goroutine of the
//     request's (a failed write's hint is stored there), bounded by the
//     request deadline that every remote call carries; Close waits for
//     them.
//
// Remote calls never see the handler's RequestCtx or its buffers: they
// get a copy of the key and of the encoded record, read-only.
type Coordinator struct {
	d          Deps
	clock      *hlc.Clock
	local      *replica.Replica
	m          *coordMetrics
	timeout    time.Duration
	hedgeDelay time.Duration // see readHedgeDelay; 0 sends reads to all `from` replicas at once
	repairMode RepairMode
	repairs    *repairQueue // background read repairs (repair.go)
	log        *slog.Logger
	inflight   sync.WaitGroup

	routes  atomic.Pointer[routes]
	fans    sync.Pool // *fan, fanOut's calls (fanout.go)
	peersMu sync.Mutex
	peers   map[string]*peer // by URL: a peer's instruments outlive views
}

// Deps are what the coordinator works with. Views, Gate, Clock and Local
// are required; a nil function or interface among the others does nothing.
type Deps struct {
	// Views returns the installed view, which a request routes by from
	// start to end (membership.Service.View).
	Views func() *view.View
	// Gate admits local replica calls routed at an epoch, as a remote
	// replica's batch server does (membership.Service).
	Gate Gate
	// Clock makes the versions of the writes this node coordinates.
	Clock *hlc.Clock
	// Local is this node's replica.
	Local *replica.Replica
	// Hints keeps the writes a replica missed (handoff.Handoff).
	Hints Hints
	// ClockCheck refuses to coordinate writes while this node's clock is
	// off from its peers' (probe.Prober.Measure, which waits for the first
	// probe round after a start): every write.
	ClockCheck func() error
	// ClockLease refuses to coordinate writes with ack of 2 or more
	// unless this node's clock is verified against a majority of the
	// cluster (probe.Prober.Verify, which may wait for a probe round);
	// nil: ClockCheck.
	ClockLease func() error
	// Rebuilding reports whether the local replica is still copying its
	// share, and must not be read (rebuild.Rebuilder.Rebuilding).
	Rebuilding func() bool
	// Streams opens other nodes' record streams, for cluster scans
	// (rpc.StreamClient).
	Streams Streams
	// Writable refuses to coordinate writes while this node's store
	// takes none (store.Store.CheckWrite: its volume is below
	// --min-free-space, or it failed a write), with an error wrapping
	// store.ErrInsufficientStorage: such a node could store neither its
	// own replica's copy nor the hints of the replicas that miss it, and
	// a client's retry through another node can succeed.
	Writable func() error
}

// Gate admits local replica calls routed at an epoch: Admit true must be
// followed by Release once the call is served.
type Gate interface {
	Admit(epoch uint64) bool
	Release()
}

// Hints keeps a write a replica missed, to deliver later; key and env are
// the call's own copies, which it may keep.
type Hints interface {
	Add(target int, key, env []byte)
}

// Streams opens the record stream of the node at url for [start, end).
type Streams interface {
	Open(ctx context.Context, url string, epoch uint64, start, end []byte) (scan.Iterator, error)
}

// peer is another node as the coordinator sees it: its transport, its
// instruments and its recent read latencies (hedge.go).
type peer struct {
	client        view.Peer
	reads, writes callMetrics
	readLat       *latencyWindow
}

// routes is a view with the coordinator's peers of it, by node id (nil for
// this node and for ids the map does not have).
type routes struct {
	*view.View
	peers []*peer
}

// route returns the routes of the installed view, derived once per view.
func (c *Coordinator) route() *routes {
	v := c.d.Views()
	if r := c.routes.Load(); r != nil && r.View == v {
		return r
	}
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	if r := c.routes.Load(); r != nil && r.View == v {
		return r
	}
	r := &routes{View: v, peers: make([]*peer, len(v.Peers))}
	for i, client := range v.Peers {
		if client == nil {
			continue
		}
		url := v.URL(i)
		p := c.peers[url]
		if p == nil || p.client != client {
			p = &peer{client: client, reads: c.m.calls(url, "get"), writes: c.m.calls(url, "put"), readLat: new(latencyWindow)}
			c.peers[url] = p
		}
		r.peers[i] = p
	}
	c.routes.Store(r)
	return r
}

// Options configures a coordinator. Zero fields take the defaults noted
// (EnsureDefaults).
type Options struct {
	// Timeout is one request's deadline for its replica calls
	// (--replica-timeout; default 300 ms). A request that has fewer than
	// ack answers by then fails with ErrNotEnoughReplicas.
	Timeout time.Duration
	// HedgeDelay is the least time a read waits for its first ack
	// replicas before asking the others too (--read-hedge-delay, whose
	// default is 5 ms; 0 asks all from replicas at once). See hedge.go
	// for how it adapts.
	HedgeDelay time.Duration
	// ReadRepair says what a read does with the stale replicas it finds
	// (--read-repair; default RepairBlocking, see repair.go).
	ReadRepair RepairMode
}

// DefaultOptions returns the defaults the fields document, and the 5 ms
// HedgeDelay the flag defaults to.
func DefaultOptions() Options {
	o := Options{HedgeDelay: 5 * time.Millisecond}
	o.EnsureDefaults()
	return o
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults (Timeout is the node's --replica-timeout).
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(&o.ReadRepair, "read-repair", "what a GET does with stale replicas it finds: blocking (repair them before replying), async, off")
	fs.DurationVar(&o.HedgeDelay, "read-hedge-delay", o.HedgeDelay, "a GET asks ack replicas first and the other from-ack on a failure or after this delay, longer while the fastest peer's 95th-percentile read latency is (0: all at once)")
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.HedgeDelay < 0 {
		return errors.New("--read-hedge-delay must not be negative")
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
}

// New returns the coordinator of d's replicas. Start starts its
// background repairs; Close waits for its calls in flight.
func New(d Deps, o Options, log *slog.Logger) *Coordinator {
	o.EnsureDefaults()
	if d.ClockCheck == nil {
		d.ClockCheck = func() error { return nil }
	}
	if d.ClockLease == nil {
		d.ClockLease = d.ClockCheck
	}
	if d.Rebuilding == nil {
		d.Rebuilding = func() bool { return false }
	}
	if d.Writable == nil {
		d.Writable = func() error { return nil }
	}
	c := &Coordinator{
		d: d, clock: d.Clock, local: d.Local, m: newCoordMetrics(), timeout: o.Timeout, hedgeDelay: o.HedgeDelay,
		repairMode: o.ReadRepair, log: log, peers: map[string]*peer{},
	}
	c.repairs = newRepairQueue(c.repairAsync, func(n int) { c.m.repairs.WithLabelValues("async", "dropped").Add(float64(n)) })
	return c
}

// Register adds the instruments, and the hedge delay read at scrape time,
// to reg. The installed view's peers get their per-peer instruments here
// (route), so that their replica-call series are exported, at 0, before
// the first request; a peer that joins later gets them at the first
// request routed by a map that has it.
func (c *Coordinator) Register(reg prometheus.Registerer) {
	var delay func() float64
	if c.hedgeDelay > 0 {
		delay = func() float64 { return c.readHedgeDelay(time.Now()).Seconds() }
	}
	c.m.register(reg, delay)
	c.route()
}

// Start runs the background read repairs.
func (c *Coordinator) Start() { c.repairs.start() }

// Factors returns the largest from and ack a request may ask, and the
// largest ack a read may ask, from one view: the replication factor
// three times, but during a replicas change, where from and a write's
// ack may be the larger of the two sets' factors (each set is asked for
// at most its own, and gives ack replicas or all it has: fanOut) and a
// read's ack at most the factor of the set it reads at the stage. See
// placement.Sets.
func (c *Coordinator) Factors() (from, readAck int) {
	v := c.d.Views()
	return v.Replicas, v.ReadFactor()
}

// Close waits for background replica calls to finish (each is bounded by
// its request's deadline), then stops the background repairs.
func (c *Coordinator) Close() {
	c.inflight.Wait()
	c.repairs.close()
}

// answer is one replica's reply.
type answer struct {
	node  int // set by fanOut
	rec   record.Record
	found bool
	err   error
}

// Result of a Get: the newest record among the answers. Found is false when
// no answering replica had the key; a tombstone is Found with Tombstone set.
type Result struct {
	Rec   record.Record
	Found bool
}

// Live reports whether the result is a value a GET returns with 200: found,
// not a tombstone, not expired.
func (r Result) Live() bool { return r.Found && r.Rec.LiveAt(time.Now()) }

// maxReplicas bounds the on-stack replica list; larger sets allocate.
const maxReplicas = 8

// Get reads key from `from` replicas and returns the newest version among
// the first `ack` answers. key may be the handler's buffer: it is copied
// before any goroutine sees it. The returned record's value must not be
// modified (it may be the cache's).
//
// A replica with a newer cluster map refuses the read (and hands its map
// over, which this node installs): the read is then routed again by the
// new map, at most twice.
//
// ack 0 is the default, a majority of from cut to the factor of the set
// the read asks, taken from the view each route is by: a read routed
// again from stream to read-new of a growth asks the new, larger set,
// whose default ack is larger (1 to 3: 1 of the old set, 2 of the new).
func (c *Coordinator) Get(key []byte, ack, from int) (Result, error) {
	for try := 0; ; try++ {
		r := c.route()
		if r.Self < 0 {
			return Result{}, ErrNotAMember
		}
		res, err := c.get(r, key, ack, from)
		if err == nil || try == 2 || c.d.Views() == r.View {
			return res, err
		}
	}
}

func (c *Coordinator) get(r *routes, key []byte, ack, from int) (Result, error) {
	if ack <= 0 {
		ack = min(from/2+1, r.ReadFactor())
	}
	var buf [maxReplicas]int
	reps := r.ReadReplicas(key, from, buf[:0])
	if len(reps) == 1 && reps[0] == r.Self && !r.Moving {
		// Single local replica: no copy, no goroutine, no channel.
		a := c.localGet(r, key)
		if a.err != nil {
			return Result{}, a.err
		}
		return Result{Rec: a.rec, Found: a.found}, nil
	}
	deadline := time.Now().Add(c.timeout)
	var best Result
	var answered [maxReplicas]replicaState
	na := 0
	n, err := c.fanOut(r, deadline, key, reps, nil, ack, 0, ack, fanOp{kind: opRead},
		func(k []byte) answer { return c.localGet(r, k) },
		func(i int, call *view.Call) {
			call.Epoch = r.Epoch()
			view.Go(r.peers[i].client, call)
		},
		func(a answer) {
			if na < len(answered) {
				answered[na] = replicaState{node: a.node, version: a.rec.Version, found: a.found}
				na++
			}
			if a.found && (!best.Found || a.rec.Newer(&best.Rec)) {
				best = Result{Rec: a.rec, Found: true}
			}
		})
	if err != nil {
		return Result{}, fmt.Errorf("get: %d of %d replicas answered, need %d: %w", n, len(reps), ack, err)
	}
	if best.Found && c.repairMode != RepairOff {
		// Before read-new, the new set's replicas are read from next:
		// the repair must leave ack of them holding best too.
		var oldBuf, newBuf [maxReplicas]int
		var newReps []int
		if r.Moving && !r.ReadNew {
			_, newReps = r.WriteSets(key, from, oldBuf[:0], newBuf[:0])
		}
		// From read-new on, a read at this from asks the new set at up
		// to a majority of from (the default): the repair leaves that
		// many of the new set holding best, so that such a read meets
		// one, even where this read's ack (cut to the old set's factor
		// in a growth) is smaller.
		newAck := max(ack, from/2+1)
		if err := c.readRepair(r, key, &best.Rec, answered[:na], reps, newReps, ack, newAck, deadline); err != nil {
			return Result{}, fmt.Errorf("get: %w", err)
		}
	}
	return best, nil
}

// Write stores value (or a tombstone) under key with a fresh version on
// `from` replicas and returns once `ack` of them have it. value may be the
// handler's buffer. A ttl above 0 makes the value expire that long after
// the version's time (see expiry). While a membership change is under
// way, the write goes to the first `from` replicas of both the old and
// the new set, and needs `ack` of each (clustermap.Stage).
//
// Real-time order across coordinators: this node's clock may not have seen
// the key's latest version (this node is not one of its replicas, or was the
// straggler of the previous write), so a fresh version from the same
// millisecond with a lower node id would lose to a write acknowledged
// before this one began. A remote replica that holds a newer version refuses
// the write and reports that version; the coordinator then observes it and
// writes once more with a version above it. One more round is enough: when
// both writes use quorums, some replica among the first round's `ack`
// answers holds every write acknowledged before this one started. A replica
// refusing again in the second round holds a write concurrent with this
// one, and either order is then correct.
//
// The local replica never needs this: every version it stores came from
// this clock or was observed by it before being applied.
//
// A replica with a newer cluster map refuses the write, as for Get: it is
// then routed again by the new map (with the same version).
//
// Clock. A write with ack of 2 or more is coordinated only while this
// node's clock is verified against a majority of the cluster (ClockLease:
// a 503 otherwise), so that its version is within --max-clock-skew of
// real time; one with ack=1 only while the clock is not measured off
// (ClockCheck). A replica's newer version beyond the bound of this clock
// cannot be observed: the write is refused with ErrReplicaAhead (503),
// having been stored in the first round below that version, where it
// loses to it as it would have anyway. A write that fails answers only
// once its version is in the past of every clock that may coordinate
// the next one (failLate), so that a write begun after the failure
// answer beats it.
//
// Storage. A node whose store takes no writes (Deps.Writable) refuses
// to coordinate one, before it makes a version.
func (c *Coordinator) Write(key, value []byte, tombstone bool, ttl time.Duration, ack, from int) error {
	if c.d.Views().Self < 0 {
		return ErrNotAMember
	}
	if err := c.d.Writable(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	check := c.d.ClockCheck
	if ack > 1 {
		check = c.d.ClockLease
	}
	if err := check(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	version, err := c.clock.Next()
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if ack > 1 {
		// A verified wall clock does not make a verified version: the
		// clock's last version may be ahead of it (an ack=1 write made
		// while it ran ahead, a bound restored from then), and a failed
		// write's wait (failLate) covers a version at most the bound ahead.
		if err := c.clock.CheckAhead(version); err != nil {
			return fmt.Errorf("write: %w: %w: refusing to coordinate writes with ack of 2 or more", ErrVersionAhead, err)
		}
	}
	rec := record.Record{Version: version, Tombstone: tombstone, Value: value, ExpiresAt: expiry(version, ttl)}
	for try := 0; ; try++ {
		r := c.route()
		if r.Self < 0 {
			if try > 0 && len(r.Map.Nodes) > 1 {
				c.failLate(rec.Version) // the earlier tries were sent
			}
			return ErrNotAMember
		}
		err := c.write(r, key, &rec, ttl, ack, from)
		if err == nil || try == 2 || c.d.Views() == r.View {
			if err != nil && len(r.Map.Nodes) > 1 {
				c.failLate(rec.Version)
			}
			return err
		}
	}
}

// failLate returns once version, that of a write about to answer that it
// failed (in a cluster of more than one: a node's own versions always
// rise), is in the past of every clock that may coordinate a later
// write: until this node's clock reads the version's time plus the skew
// bound (hlc.Clock.MaxAhead), and 1 ms for the version's own millisecond.
//
// Why. The failed write may be stored where it got to (this node, cut
// off, or a replica whose answer came late), and last-write-wins carries
// it wherever anti-entropy goes. A write the client begins after this
// answer must beat it. That write's coordinator is verified (a lease, or
// measured not off for ack=1), so with one clock off its clock is at most
// the bound behind this one: when this one is the clock off, ahead, the
// other is correct; when this one is correct, the other is within the
// bound of real time. Once this clock has passed the version by the bound,
// every such coordinator's clock is past it too, and its version is
// higher. The wait is that of CockroachDB's commit-wait, paid only by
// failures: a write that fails on the replica timeout has already spent
// most of it.
func (c *Coordinator) failLate(version uint64) {
	bound := c.clock.MaxAhead()
	wait := hlc.TimeOf(version).Add(bound + time.Millisecond).Sub(c.clock.Wall())
	if wait <= 0 {
		return
	}
	// The version is at most the bound ahead of this clock (every version
	// it observed was), so the wait is at most twice the bound; a clock
	// stepped back since would make it longer, and the lease refuses the
	// next write then.
	wait = min(wait, 2*bound+time.Millisecond)
	c.m.failWait.Add(wait.Seconds())
	time.Sleep(wait)
}

// ErrNotAMember refuses a request on a node that is not a member of the
// cluster map it routes by: decommissioned or removed, or its id given to
// a machine at another address (replace), and not stopped yet (it stops
// once it learns so: node.Left). Its replica is no longer any key's, and
// the map has no transport to the node now holding its id.
var ErrNotAMember = errors.New("this node is not a member of the cluster map (decommissioned, removed or replaced): send requests to another node")

// ErrVersionAhead refuses a write with ack of 2 or more because this
// node's clock would version it beyond --max-clock-skew ahead of its wall
// clock: it issued or observed such a version while its clock ran ahead,
// and its clock was put right since. It coordinates them again once its
// wall clock is within the bound of that version.
var ErrVersionAhead = errors.New("this node's clock issues versions too far ahead of its wall clock")

// ErrReplicaAhead refuses a write because a replica holds a version of
// the key too far ahead of this node's clock to be observed: a node whose
// clock ran ahead made it. The write cannot be ordered after it until
// this clock is within --max-clock-skew of it.
var ErrReplicaAhead = errors.New("a replica holds a version of the key too far ahead of this node's clock")

func (c *Coordinator) write(r *routes, key []byte, rec *record.Record, ttl time.Duration, ack, from int) error {
	var oldBuf, newBuf [maxReplicas]int
	old, new := r.WriteSets(key, from, oldBuf[:0], newBuf[:0])
	if len(old) == 1 && old[0] == r.Self && new == nil {
		return c.localApply(r, key, rec) // the store copies key and value into its batch
	}
	newer, by, err := c.writeRound(r, key, rec, old, new, ack)
	if err == nil && newer > rec.Version {
		if err = c.local.Observe(newer); err != nil {
			if errors.Is(err, hlc.ErrTooFarAhead) {
				return fmt.Errorf("write: %w: %s holds version %d (%v): %w", ErrReplicaAhead, r.URL(by), newer,
					hlc.TimeOf(newer).UTC().Format(time.RFC3339Nano), err)
			}
			return fmt.Errorf("write: %w", err)
		}
		if rec.Version, err = c.clock.Next(); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		rec.ExpiresAt = expiry(rec.Version, ttl)
		_, _, err = c.writeRound(r, key, rec, old, new, ack)
	}
	return err
}

// expiry is when a value written at version with a ttl expires: the
// version's time plus the ttl, in Unix milliseconds (0: ttl 0, never).
// Taking the version's time makes the expiry the coordinator's, once, and
// part of the record every replica stores.
func expiry(version uint64, ttl time.Duration) uint64 {
	if ttl <= 0 {
		return 0
	}
	return uint64(hlc.TimeOf(version).Add(ttl).UnixMilli())
}

// writeRound sends rec to the replicas of old and new (nil: no change
// under way) and returns the newest version a replica refused it with (0
// if none did), and that replica. A refusal for a newer version counts as
// an answer.
func (c *Coordinator) writeRound(r *routes, key []byte, rec *record.Record, old, new []int, ack int) (newer uint64, by int, err error) {
	// One immutable envelope for all remote replicas; it copies the value
	// out of the handler's buffer.
	env := rec.Encode()
	n, err := c.fanOut(r, time.Now().Add(c.timeout), key, old, new, ack, ack, len(old)+len(new), fanOp{kind: opWrite, env: env},
		func(k []byte) answer { return answer{err: c.localApply(r, k, rec)} },
		func(i int, call *view.Call) {
			call.Env, call.Epoch = env, r.Epoch()
			view.Go(r.peers[i].client, call)
		},
		func(a answer) {
			if a.rec.Version > newer {
				newer, by = a.rec.Version, a.node
			}
		})
	if err != nil {
		return 0, 0, fmt.Errorf("write: %d replicas acknowledged, need %d: %w", n, ack, err)
	}
	return newer, by, nil
}

// ErrLocalRebuilding fails reads of the local replica while it rebuilds:
// a point read's coordinator asks other replicas instead; a scan of this
// node's records alone (ScanLocal) has no other source and fails.
var ErrLocalRebuilding = fmt.Errorf("%w: this node's replica is rebuilding", ErrNotEnoughReplicas)

// errLocalStale fails a local replica call routed by a map older than the
// one installed since: the request is routed again.
var errLocalStale = fmt.Errorf("local replica: %w", rpc.ErrStaleEpoch)

func (c *Coordinator) localGet(r *routes, key []byte) answer {
	if c.d.Rebuilding() {
		return answer{err: ErrLocalRebuilding}
	}
	if !c.d.Gate.Admit(r.Epoch()) {
		return answer{err: errLocalStale}
	}
	e, err := c.local.Get(key)
	c.d.Gate.Release()
	if err != nil {
		return answer{err: err}
	}
	return answer{rec: e.Rec, found: e.Found}
}

// localApply stores rec here, under the gate as a remote replica would
// (see Gate).
func (c *Coordinator) localApply(r *routes, key []byte, rec *record.Record) error {
	if !c.d.Gate.Admit(r.Epoch()) {
		return errLocalStale
	}
	defer c.d.Gate.Release()
	return c.local.Apply(key, rec)
}

// ApplyRemote stores rec, a record another node made, on the local
// replica (replica.ApplyRemote) under the gate of v's epoch. A version the
// replica refuses (too far ahead of its clock) is an error; one it holds
// newer is not: the replica is as new as rec or newer. Read repair and
// anti-entropy store what they bring here by it.
func (c *Coordinator) ApplyRemote(v *view.View, key []byte, rec *record.Record) error {
	var out [1]replica.Outcome
	res, err := c.ApplyRemoteBatch(v, []store.Write{{Key: key, Rec: rec}}, out[:0])
	if err != nil {
		return err
	}
	return res[0].Refused
}

// ApplyRemoteBatch is ApplyRemote for many records in one commit, with
// each one's outcome (replica.ApplyRemote; out is reused): anti-entropy
// stores the records it pulls by it.
func (c *Coordinator) ApplyRemoteBatch(v *view.View, ws []store.Write, out []replica.Outcome) ([]replica.Outcome, error) {
	if !c.d.Gate.Admit(v.Epoch()) {
		return out[:0], errLocalStale
	}
	defer c.d.Gate.Release()
	return c.local.ApplyRemote(ws, out)
}
