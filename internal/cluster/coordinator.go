package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
)

// ErrNotEnoughReplicas is returned when fewer than ack replicas answered
// before the deadline (or success became impossible); the error is a
// *ReplicasError that says which.
var ErrNotEnoughReplicas = errors.New("not enough replicas")

// ReplicasError is ErrNotEnoughReplicas with its account: how many
// replicas were asked and answered, how many were needed, and each one
// that failed, with why.
type ReplicasError struct {
	Answered, Need, Asked int
	// BothSets: a membership change was under way, and Need was needed
	// of the old and of the new replica set each.
	BothSets bool
	Failed   []ReplicaFailure
}

// ReplicaFailure is one replica's failure in a request.
type ReplicaFailure struct {
	Node   string
	Reason string // "timeout", "refused", or the error
}

func (e *ReplicasError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "not enough replicas: %d of %d answered, %d needed", e.Answered, e.Asked, e.Need)
	if e.BothSets {
		b.WriteString(" of the old and of the new replica set each (a membership change is under way)")
	}
	for i, f := range e.Failed {
		if i == 0 {
			b.WriteString("; failed: ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", f.Node, f.Reason)
	}
	return b.String()
}

func (e *ReplicasError) Is(target error) bool { return target == ErrNotEnoughReplicas }

// failureReason is a replica call's error in a word or a line.
func failureReason(err error) string {
	switch {
	case errors.Is(err, rpc.ErrTimeout):
		return "timeout"
	case rpc.IsRefused(err):
		return "refused: " + err.Error()
	}
	return err.Error()
}

// Coordinator runs client requests against a key's replicas. The node that
// receives a request coordinates it.
//
// Shape of one request (Get and Write share it, see fanOut):
//
//  1. placement picks the key's first `from` replicas;
//  2. each remote replica is called in its own goroutine, which sends its
//     answer on a channel buffered for every replica, so a goroutine that
//     finishes after the coordinator has answered never blocks (writes
//     call all `from` replicas at once; reads call `ack` of them first and
//     the others on a failure or after --read-hedge-delay, see fanOut);
//  3. the local replica, if in the set, is served in-process on the
//     calling goroutine while the remote calls are in flight;
//  4. the coordinator returns as soon as `ack` replicas have answered, or as
//     soon as so many failed that `ack` is out of reach;
//  5. stragglers finish in the background, bounded by the request deadline
//     that every remote call carries; Close waits for them.
//
// Remote goroutines never see the handler's RequestCtx or its buffers: they
// get a copy of the key and of the encoded record, read-only.
type Coordinator struct {
	installState // the cluster map's view and its gate (view.go)
	clock        *hlc.Clock
	local        *replica.Replica
	m            *coordMetrics
	rpcMetrics   *rpc.Metrics
	peerOpts     rpc.PeerOptions
	timeout      time.Duration
	// hedgeDelay is the least time a read waits for its first replicas
	// (see readHedgeDelay); 0 sends reads to all `from` replicas at once.
	hedgeDelay     time.Duration
	streams        *rpc.StreamClient // other nodes' range streams (scan.go)
	repairMode     RepairMode
	repairs        *repairQueue // background read repairs (repair.go)
	handoff        *handoff     // hints for replicas that missed a write (handoff.go)
	ae             *antiEntropy // comparing replicas' data (antientropy.go)
	gc             *collector   // removing tombstones every replica has (gc.go)
	moves          *mover       // copying partitions gained, dropping those lost (move.go)
	driver         *driver      // running the membership changes this node began (change.go)
	moved          atomic.Uint64
	onLeft         func()
	leftOnce       sync.Once
	selfURL        string // this node's URL in the map it started with
	summaryTimeout time.Duration
	maxKeyBytes    int
	probe          *prober    // peers' reachability and clocks (probe.go)
	rebuild        *rebuilder // copying this node's share after an empty start (rebuild.go)
	rebuilding     atomic.Bool
	// formed: every peer has answered once (rebuild.go); recordFormed
	// persists it.
	formed       atomic.Bool
	formedMu     sync.Mutex // guards recordFormed, set after the probe started
	recordFormed func() error
	log          *slog.Logger

	inflight sync.WaitGroup
}

// peer is another node as the coordinator sees it: its client, its
// instruments and its recent read latencies (hedge.go).
type peer struct {
	client        *rpc.Peer
	reads, writes callMetrics
	readLat       *latencyWindow
	down          atomic.Bool // the last probe failed
	seen          atomic.Bool // a probe succeeded once
	// The probes' last outcomes, for status (PeerStates).
	stateMu           sync.Mutex
	lastOK, lastErrAt time.Time
	lastErr           string
}

// Options configures a coordinator. Zero fields take the defaults noted.
type Options struct {
	// Timeout is one request's deadline for its replica calls
	// (--replica-timeout; default 300 ms). A request that has fewer than
	// ack answers by then fails with ErrNotEnoughReplicas.
	Timeout time.Duration
	// HedgeDelay is the least time a read waits for its first ack
	// replicas before asking the others too (--read-hedge-delay; 0 asks
	// all from replicas at once). See hedge.go for how it adapts.
	HedgeDelay time.Duration
	// ReadRepair says what a read does with the stale replicas it finds
	// (--read-repair; default RepairBlocking, see repair.go).
	ReadRepair RepairMode
	// ScanIdleTimeout bounds how long another node's range stream may
	// send nothing before a cluster scan fails (default 30 s).
	ScanIdleTimeout time.Duration
	// MaxKeyBytes and MaxValueBytes bound what other nodes' streams may
	// carry (the node's --max-key-bytes and --max-value-bytes).
	MaxKeyBytes, MaxValueBytes int
	// MaxClockSkew is how far this node's clock may be off from its peers'
	// before it refuses to coordinate writes (--max-clock-skew; default
	// 5 s; see probe.go).
	MaxClockSkew time.Duration
	// ProbeInterval is how often every peer is pinged (default 1 s).
	ProbeInterval time.Duration
	// OnLeft is called once when an installed map no longer has this
	// node: it was decommissioned (default: nothing).
	OnLeft func()
	// Handoff configures hinted handoff (handoff.go).
	Handoff HandoffOptions
	// AntiEntropy configures the comparison of replicas (antientropy.go).
	AntiEntropy AntiEntropyOptions
	// GC configures the removal of tombstones and expired values (gc.go).
	GC GCOptions
	// Peer configures the client of every other node.
	Peer rpc.PeerOptions
}

// NewCoordinator wires the coordinator for node self of cluster map m
// (persisted by the caller), starts its background work (repairs, hint
// delivery, probes, anti-entropy, collection, and a change the map has
// under way) and registers its instruments with reg (nil: not
// registered). Close stops it.
func NewCoordinator(m *membership.Map, self int, clock *hlc.Clock, local *replica.Replica, o Options, reg prometheus.Registerer, log *slog.Logger) (*Coordinator, error) {
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
	if o.ScanIdleTimeout <= 0 {
		o.ScanIdleTimeout = 30 * time.Second
	}
	if o.Peer.Timeout <= 0 {
		o.Peer.Timeout = o.Timeout
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = hlc.DefaultMaxAhead
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.Peer.SummaryTimeout <= 0 {
		o.Peer.SummaryTimeout = 30 * time.Second
	}
	if o.OnLeft == nil {
		o.OnLeft = func() {}
	}
	o.Peer.Now = clock.Wall
	c := &Coordinator{
		clock: clock, local: local, m: newCoordMetrics(), peerOpts: o.Peer,
		timeout: o.Timeout, hedgeDelay: o.HedgeDelay, repairMode: o.ReadRepair, log: log,
		summaryTimeout: o.Peer.SummaryTimeout, maxKeyBytes: o.MaxKeyBytes, onLeft: o.OnLeft,
		streams: rpc.NewStreamClient(rpc.StreamOptions{
			OpenTimeout: o.Timeout,
			IdleTimeout: o.ScanIdleTimeout,
			Secret:      o.Peer.Secret,
			Dial:        o.Peer.Dial,
			TLS:         o.Peer.TLS,
			MaxKey:      o.MaxKeyBytes,
			MaxEnvelope: o.MaxValueBytes + record.HeaderSize,
		}),
	}
	c.clients, c.pushed = map[string]*peer{}, map[string]uint64{}
	if reg != nil {
		c.rpcMetrics = rpc.NewMetrics(reg)
	}
	n := m.Node(self)
	if n == nil {
		return nil, fmt.Errorf("node %d is not in the cluster map (%s)", self, m)
	}
	c.selfURL = n.URL
	v := c.newView(m, self)
	c.view.Store(v)
	c.m.epoch.Set(float64(m.Epoch))
	var err error
	if c.handoff, err = newHandoff(c, local.Store, o.Handoff); err != nil {
		return nil, err
	}
	c.ae = newAntiEntropy(c, o.AntiEntropy) // before the handoff starts: a dropped hint schedules an exchange
	c.gc = newCollector(c, o.GC)
	c.moves = newMover(c)
	c.driver = newDriver(c)
	if reg != nil {
		var delay func() float64
		if c.hedgeDelay > 0 {
			delay = func() float64 { return c.readHedgeDelay(time.Now()).Seconds() }
		}
		c.m.register(reg, delay)
		c.handoff.m.register(reg)
	}
	// The background work starts last: it uses the peers.
	c.repairs = newRepairQueue(c)
	c.handoff.start()
	c.probe = newProber(c, o.ProbeInterval, o.MaxClockSkew)
	c.probe.start()
	c.ae.start()
	c.gc.start()
	c.afterInstall(v)
	return c, nil
}

// Replicas is the replication factor: how many nodes keep each
// partition, the largest from a request may ask.
func (c *Coordinator) Replicas() int { return c.v().Replicas }

// Timeout is the per-request replica deadline.
func (c *Coordinator) Timeout() time.Duration { return c.timeout }

// Close waits for background replica calls to finish (each is bounded by its
// request's deadline), stops the background repairs, then closes the idle
// connections to peers.
func (c *Coordinator) Close() {
	c.driver.close()
	c.moves.close()
	c.rebuild.close()
	c.gc.close()
	c.ae.close()
	c.inflight.Wait()
	c.probe.close()
	c.repairs.close()
	c.handoff.close()
	c.clientsMu.Lock()
	for _, p := range c.clients {
		p.client.Close()
	}
	c.clientsMu.Unlock()
	c.streams.Close()
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
func (c *Coordinator) Get(key []byte, ack, from int) (Result, error) {
	for try := 0; ; try++ {
		v := c.v()
		res, err := c.get(v, key, ack, from)
		if err == nil || try == 2 || c.v() == v {
			return res, err
		}
	}
}

func (c *Coordinator) get(v *view, key []byte, ack, from int) (Result, error) {
	var buf [maxReplicas]int
	reps := v.ReadReplicas(key, from, buf[:0])
	if len(reps) == 1 && reps[0] == v.self && !v.Moving {
		// Single local replica: no copy, no goroutine, no channel.
		a := c.localGet(v, key)
		if a.err != nil {
			return Result{}, a.err
		}
		return Result{Rec: a.rec, Found: a.found}, nil
	}
	deadline := time.Now().Add(c.timeout)
	var best Result
	var answered [maxReplicas]replicaState
	na := 0
	n, err := c.fanOut(v, deadline, key, reps, nil, ack, ack,
		func(k []byte) answer { return c.localGet(v, k) },
		func(i int, k []byte, deadline time.Time) answer {
			p := v.peers[i]
			start := time.Now()
			rec, found, err := p.client.Get(k, v.m.Epoch, deadline)
			end := p.reads.observe(start, err)
			if err == nil {
				p.readLat.record(end.Sub(start), end)
			}
			if found {
				// Keeps clocks close; nothing is stored here, so a failure
				// to persist the bound only costs that.
				_ = c.clock.Observe(rec.Version)
			}
			return answer{rec: rec, found: found, err: err}
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
		if err := c.readRepair(v, key, &best.Rec, answered[:na], reps, ack, deadline); err != nil {
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
// the new set, and needs `ack` of each (membership.Stage).
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
func (c *Coordinator) Write(key, value []byte, tombstone bool, ttl time.Duration, ack, from int) error {
	if err := c.probe.check(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	version, err := c.clock.Next()
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	rec := record.Record{Version: version, Tombstone: tombstone, Value: value, ExpiresAt: expiry(version, ttl)}
	for try := 0; ; try++ {
		v := c.v()
		err := c.write(v, key, &rec, ttl, ack, from)
		if err == nil || try == 2 || c.v() == v {
			return err
		}
	}
}

func (c *Coordinator) write(v *view, key []byte, rec *record.Record, ttl time.Duration, ack, from int) error {
	var oldBuf, newBuf [maxReplicas]int
	old, new := v.WriteSets(key, from, oldBuf[:0], newBuf[:0])
	if len(old) == 1 && old[0] == v.self && new == nil {
		return c.localApply(v, key, rec) // the store copies key and value into its batch
	}
	newer, err := c.writeRound(v, key, rec, old, new, ack)
	if err == nil && newer > rec.Version {
		if err = c.clock.Observe(newer); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if rec.Version, err = c.clock.Next(); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		rec.ExpiresAt = expiry(rec.Version, ttl)
		_, err = c.writeRound(v, key, rec, old, new, ack)
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
// if none did). A refusal for a newer version counts as an answer.
func (c *Coordinator) writeRound(v *view, key []byte, rec *record.Record, old, new []int, ack int) (newer uint64, err error) {
	// One immutable envelope for all remote replicas; it copies the value
	// out of the handler's buffer.
	env := rec.Encode()
	n, err := c.fanOut(v, time.Now().Add(c.timeout), key, old, new, ack, len(old)+len(new),
		func(k []byte) answer { return answer{err: c.localApply(v, k, rec)} },
		func(i int, k []byte, deadline time.Time) answer {
			p := v.peers[i]
			start := time.Now()
			ver, err := p.client.Apply(k, env, v.m.Epoch, deadline)
			p.writes.observe(start, err)
			if err != nil && !rpc.IsRefused(err) && !errors.Is(err, rpc.ErrStaleEpoch) {
				c.handoff.add(i, k, env) // k and env are this request's own copies
			}
			return answer{rec: record.Record{Version: ver}, err: err}
		},
		func(a answer) { newer = max(newer, a.rec.Version) })
	if err != nil {
		return 0, fmt.Errorf("write: %d replicas acknowledged, need %d: %w", n, ack, err)
	}
	return newer, nil
}

// errLocalRebuilding fails reads of the local replica while it rebuilds.
var errLocalRebuilding = fmt.Errorf("%w: this node's replica is rebuilding", ErrNotEnoughReplicas)

// errLocalStale fails a local replica call routed by a map older than the
// one installed since: the request is routed again.
var errLocalStale = fmt.Errorf("local replica: %w", rpc.ErrStaleEpoch)

func (c *Coordinator) localGet(v *view, key []byte) answer {
	if c.rebuilding.Load() {
		return answer{err: errLocalRebuilding}
	}
	if !c.admit(v.m.Epoch) {
		return answer{err: errLocalStale}
	}
	e, err := c.local.Get(key)
	c.gate.RUnlock()
	if err != nil {
		return answer{err: err}
	}
	return answer{rec: e.Rec, found: e.Found}
}

// localApply stores rec here, under the gate as a remote replica would
// (see admit).
func (c *Coordinator) localApply(v *view, key []byte, rec *record.Record) error {
	if !c.admit(v.m.Epoch) {
		return errLocalStale
	}
	defer c.gate.RUnlock()
	return c.local.Apply(key, rec)
}

// applyRemote stores rec, a record another node made, on the local
// replica under the gate of v's epoch (see admit). A version the replica
// refuses (too far ahead of its clock) is an error; one it holds newer is
// not: the replica is as new as rec or newer.
func (c *Coordinator) applyRemote(v *view, key []byte, rec *record.Record) error {
	if !c.admit(v.m.Epoch) {
		return errLocalStale
	}
	defer c.gate.RUnlock()
	var out [1]replica.Outcome
	res, err := c.local.ApplyRemote([]store.Write{{Key: key, Rec: rec}}, out[:0])
	if err != nil {
		return err
	}
	return res[0].Refused
}

// fanOut calls the replicas of old and new (the second set only while a
// membership change is under way; nil otherwise) and feeds successful
// answers to merge (on the calling goroutine, so merge needs no lock)
// until ack answered in each set, or that became impossible. A replica in
// both sets is called once and counts in both. It returns the number of
// successes.
//
// Writes start every replica at once (initial = all). Reads start only
// `initial` = ack of them, the local replica first (it costs no network),
// and start a spare as soon as one fails, and all the spares once
// hedgeDelay has passed without ack answers. Every remote call costs a
// client and a server request, so this halves the work of a GET
// ack=2/from=3 without changing its answers or its failure semantics: a dead replica still fails over at once, a slow one after
// hedgeDelay. hedgeDelay 0 starts everything at once, like a write.
func (c *Coordinator) fanOut(
	v *view, deadline time.Time, key []byte, old, new []int, ack, initial int,
	local func(key []byte) answer,
	remote func(node int, key []byte, deadline time.Time) answer,
	merge func(answer),
) (int, error) {
	var repBuf [2 * maxReplicas]int
	reps := append(repBuf[:0], old...)
	for _, n := range new {
		if !slices.Contains(old, n) {
			reps = append(reps, n)
		}
	}
	if c.hedgeDelay == 0 {
		initial = len(reps)
	}
	for i, n := range reps { // the local replica first
		if n == v.self {
			copy(reps[1:i+1], reps[:i])
			reps[0] = n
			break
		}
	}
	// The sets' counts: a success or failure of node n counts in each set
	// that has it.
	var ok, failed [2]int
	sets := [2][]int{old, new}
	count := func(n int, into *[2]int) {
		for s, set := range sets {
			if slices.Contains(set, n) {
				into[s]++
			}
		}
	}
	done := func() bool { return ok[0] >= ack && (new == nil || ok[1] >= ack) }
	hopeless := func() bool {
		return failed[0] > len(old)-ack || (new != nil && failed[1] > len(new)-ack)
	}
	now := time.Now()
	k := bytes.Clone(key) // the goroutines outlive the handler's buffer
	results := make(chan answer, len(reps))
	next, runLocal := 0, false
	launch := func(count int) {
		for ; count > 0 && next < len(reps); count-- {
			n := reps[next]
			next++
			if n == v.self {
				runLocal = true
				continue
			}
			c.inflight.Add(1)
			c.m.inFlight.Inc()
			go func() {
				defer c.inflight.Done()
				a := remote(n, k, deadline)
				a.node = n
				results <- a // never blocks: buffered for all
				c.m.inFlight.Dec()
			}()
		}
	}
	launch(initial)

	succeeded, answered := 0, 0
	var firstErr error
	var failures []ReplicaFailure // only built when a call fails
	timedOut := false
	heard := make([]bool, 0, 8) // by position in reps, of the calls answered
	take := func(a answer) {
		answered++
		for i, n := range reps {
			if n == a.node {
				for len(heard) <= i {
					heard = append(heard, false)
				}
				heard[i] = true
			}
		}
		if a.err != nil {
			count(a.node, &failed)
			if firstErr == nil {
				firstErr = a.err
			}
			failures = append(failures, ReplicaFailure{Node: v.url(a.node), Reason: failureReason(a.err)})
			launch(1) // replace it with a spare, if any is left
			return
		}
		succeeded++
		count(a.node, &ok)
		if merge != nil {
			merge(a)
		}
	}
	if runLocal {
		a := local(k)
		a.node = v.self
		take(a)
	}
	// One timer: first the hedge delay (reads with spares left), then just
	// after the request's deadline. Every call ends by the deadline on its
	// own (and is then counted as an answer, not a straggler); the wait has
	// a bound of its own too, so no call can hold the answer much past it.
	if !done() && !hopeless() {
		hedging := next < len(reps)
		grace := min(c.timeout/10, 50*time.Millisecond)
		wait := deadline.Sub(now) + grace
		if hedging {
			wait = min(wait, c.readHedgeDelay(now))
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
	wait:
		for !done() && !hopeless() {
			select {
			case a := <-results:
				take(a)
			case <-timer.C:
				if !hedging {
					if firstErr == nil {
						firstErr = fmt.Errorf("%w: no answer by the deadline", rpc.ErrTimeout)
					}
					timedOut = true
					break wait
				}
				hedging = false
				if next < len(reps) {
					c.m.hedgedReads.Inc()
				}
				launch(len(reps))
				timer.Reset(time.Until(deadline) + grace)
			}
		}
	}
	if next > answered {
		c.m.stragglers.Add(float64(next - answered))
	}
	if !done() {
		pending := "no answer yet when ack was out of reach"
		if timedOut {
			pending = "no answer by the deadline"
		}
		for i, n := range reps[:next] { // asked, not heard from
			if i >= len(heard) || !heard[i] {
				failures = append(failures, ReplicaFailure{Node: v.url(n), Reason: pending})
			}
		}
		c.log.Debug("replicas failed", "ok", succeeded, "need", ack, "err", firstErr)
		return succeeded, &ReplicasError{Answered: succeeded, Need: ack, Asked: next, BothSets: new != nil, Failed: failures}
	}
	return succeeded, nil
}
