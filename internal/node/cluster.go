package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/client"

	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/gc"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/rebuild"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/settle"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// buildCluster makes the node's cluster parts, claims the data
// directory's identity, then starts the parts. Each part takes what it
// works with, not another part: the view source (membership), the
// replica, the clock, a logger, and from its neighbours a function or a
// narrow interface.
//
// Start order, and its reverse for Close (closeCluster): membership first
// (it owns the peers' transports, which every other part calls through,
// so they close last), then the probe, hinted handoff, the coordinator,
// anti-entropy, garbage collection, and a rebuild last.
func (n *Node) buildCluster(cmap *clustermap.Map, self int, joined bool, topo clustermap.Topology, clock *hlc.Clock, local *replica.Replica, peerTLS *tls.Config) error {
	cfg, log := n.cfg, n.log
	rpcMetrics := rpc.NewMetrics(n.registry)
	n.lateBatches = rpcMetrics.Late
	peerOpts := rpc.PeerOptions{
		Timeout: cfg.ReplicaTimeout, Conns: cfg.PeerConns, Secret: cfg.ClusterSecret, Dial: cfg.PeerDial, TLS: peerTLS,
		// Every node's batch body limit holds this, whatever its
		// --max-value-bytes (Config.maxBatchBytes).
		MaxBatchBytes: rpc.DefaultMaxBatchBytes,
		// A peer's answer ends with at most one value over the answer
		// budget, of up to its --max-value-bytes: taken up to 1 GiB, or
		// this node's own limit where that is larger (as streams are).
		MaxAnswerBytes: max(cfg.MaxValueBytes, streamValueBytes) + record.MaxHeaderSize + cfg.MaxKeyBytes + 2*rpc.DefaultMaxAnswerBytes,
		SummaryTimeout: 30 * time.Second,
		Now:            clock.Wall,
	}
	n.streams = rpc.NewStreamClient(rpc.StreamOptions{
		OpenTimeout: cfg.ReplicaTimeout,
		// A range stream may run for any time; the write timeout then
		// bounds a stall instead of the whole response.
		IdleTimeout: cfg.WriteTimeout,
		Secret:      cfg.ClusterSecret,
		Dial:        cfg.PeerDial,
		TLS:         peerTLS,
		// A peer's record: an expiring one's header included, and at
		// least what streamValueBytes allows whatever this node's own
		// limits (a rolling change of them; records written before a
		// limit was lowered). The decoder's memory follows the bytes
		// received, so a generous bound costs nothing.
		MaxKey:      max(cfg.MaxKeyBytes, streamKeyBytes),
		MaxEnvelope: max(cfg.MaxValueBytes, streamValueBytes) + record.MaxHeaderSize,
	})

	// Membership, the copier and anti-entropy need each other: the mover
	// copies by partition streams and anti-entropy exchanges, the copier
	// applies under membership's gate, and anti-entropy routes by
	// membership's views. None calls another before Start.
	var ae *antientropy.Service
	var copier *partcopy.Copier
	var err error
	memberOpts := cfg.Membership
	memberOpts.Dial = func(url string, maps rpc.Maps) view.Peer {
		o := peerOpts
		o.Maps = maps
		return rpc.NewPeer(url, o, rpcMetrics)
	}
	memberOpts.Copy = copyFunc(func(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error) {
		return copier.Copy(ctx, url, epoch, parts)
	})
	memberOpts.Exchange = exchangeFunc(func(ctx context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error) {
		return ae.Exchange(ctx, v, peer, parts, pullOnly)
	})
	memberOpts.Installed = func(v *view.View) { ae.Members(v) }
	memberOpts.OnLeft = n.left
	// The rebuild is built after the service (it copies through the
	// copier, which applies under the service's gate); the service asks
	// only once started, after it exists.
	memberOpts.Rebuilding = func() bool { return n.rebuild.Rebuilding() }
	memberOpts.Timeout = cfg.ReplicaTimeout
	if err := n.openMapLog(cmap, self, topo, peerTLS); err != nil {
		n.streams.Close()
		return err
	}
	memberOpts.Log = n.mapLog
	n.members, err = membership.New(cmap, self, local, memberOpts, log)
	if err != nil {
		n.closeMapLog()
		n.streams.Close()
		return err
	}
	copier = partcopy.New(local, n.streams, n.members, cfg.Move, log)
	id, err := n.claimIdentity(cmap, self, joined)
	if err != nil {
		n.members.Close()
		n.closeMapLog()
		n.streams.Close()
		return err
	}
	probeOpts := cfg.Probe
	probeOpts.MaxClockSkew, probeOpts.Timeout, probeOpts.Wall = cfg.MaxClockSkew, cfg.ReplicaTimeout, clock.Wall
	probeOpts.Formed = id.Formed
	probeOpts.RecordFormed = func() error {
		return n.identity.update(func(i *store.Identity) {
			i.Formed = true
			if i.FormedAt.IsZero() {
				i.FormedAt = time.Now()
			}
		})
	}
	n.probe = probe.New(n.members.View, probeOpts, log)
	n.rebuild = rebuild.New(n.members.View, copier, rebuild.Options{
		Rebuilding: id.Rebuilding, Done: func() error { return n.identity.update(func(i *store.Identity) { i.Rebuilding = false }) },
		Unconfirmed: id.Unconfirmed, Created: id.Created, Skew: cfg.MaxClockSkew, Timeout: cfg.ReplicaTimeout,
		Confirmed: func(lost bool) error {
			return n.identity.update(func(i *store.Identity) { i.Unconfirmed, i.Rebuilding = false, lost })
		},
	}, log)
	hintOpts := cfg.Handoff
	hintOpts.Timeout = cfg.ReplicaTimeout
	n.hints, err = handoff.New(n.store, n.members.View, func(target int) { ae.Soon(target) }, hintOpts, log)
	if err != nil {
		n.members.Close()
		n.closeMapLog()
		n.streams.Close()
		return err
	}
	coordOpts := cfg.Coordinator
	coordOpts.Timeout = cfg.ReplicaTimeout
	n.coord = cluster.New(cluster.Deps{
		Views: n.members.View, Gate: n.members, Clock: clock, Local: local, Hints: n.hints,
		ClockCheck: n.probe.Measure, ClockLease: n.probe.Verify, Rebuilding: n.rebuild.Rebuilding, Streams: n.streams,
		Writable: n.store.CheckWrite,
	}, coordOpts, log)
	aeOpts := cfg.AntiEntropy
	aeOpts.Timeout, aeOpts.SummaryTimeout, aeOpts.MaxKeyBytes = cfg.ReplicaTimeout, peerOpts.SummaryTimeout, cfg.MaxKeyBytes
	aeOpts.Writable = n.store.Writable
	ae = antientropy.New(local, n.members.View, n.coord.ApplyRemoteBatch, n.rebuild.Rebuilding, aeOpts, log)
	n.ae = ae
	gcOpts := cfg.GC
	gcOpts.Grace = cfg.gcGrace()
	gcOpts.Lag = cfg.MaxClockSkew + cfg.ReplicaTimeout + time.Second
	n.gc = gc.New(local, n.members.View, ae.SyncedSince, n.rebuild.Rebuilding, gcOpts, log)
	n.settle = settle.New(n.store, cfg.Settle, log)

	n.members.Register(n.registry)
	copier.Register(n.registry)
	n.probe.Register(n.registry)
	n.registry.MustRegister(n.settingsMetric())
	n.hints.Register(n.registry)
	n.coord.Register(n.registry)
	ae.Register(n.registry)
	n.gc.Register(n.registry)
	n.settle.Register(n.registry)
	n.rebuild.Register(n.registry)
	n.pace = pace.New(cfg.Pace, log)
	n.streamPace = partcopy.SendLimiter(cfg.Move)
	for _, l := range []*rate.Limiter{ae.Limiter(), ae.SummaryLimiter(), n.hints.Limiter(), copier.Limiter(), n.streamPace, n.members.Limiter(), n.gc.Limiter(), n.settle.Limiter()} {
		n.pace.Govern(l)
	}
	n.pace.Register(n.registry)

	n.members.Start()
	n.probe.Start()
	n.hints.Start()
	n.coord.Start()
	ae.Start()
	n.gc.Start()
	n.settle.Start()
	n.rebuild.Start()
	n.pace.Start()
	return nil
}

// closeCluster stops the cluster parts in the reverse order of their
// start (buildCluster).
func (n *Node) closeCluster() {
	n.pace.Close()
	n.rebuild.Close()
	n.settle.Close()
	n.gc.Close()
	n.ae.Close()
	n.coord.Close() // waits for the replica calls in flight
	n.hints.Close()
	n.probe.Close()
	n.members.Close()
	n.closeMapLog() // after membership, which follows it
	n.streams.Close()
}

// copyFunc makes a function a membership.Copier.
type copyFunc func(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error)

func (f copyFunc) Copy(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error) {
	return f(ctx, url, epoch, parts)
}

// exchangeFunc makes a function a membership.Exchanger.
type exchangeFunc func(ctx context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error)

func (f exchangeFunc) Exchange(ctx context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error) {
	return f(ctx, v, peer, parts, pullOnly)
}

// claimIdentity checks that the data directory is this node's, and gives
// an empty one its identity. A directory of another cluster, or of another
// node of this one, is refused: serving it would mix two datasets. An
// empty directory while a peer knows the cluster is formed is a wiped or
// replaced disk: the node rebuilds its share before serving reads
// (package rebuild), and resumes a rebuild a stop interrupted; while not
// every peer answered, it is unconfirmed, and asks them later. It returns
// the identity, and keeps it in n.identity, by which the parts record
// what changes of it later (formed, rebuilt, confirmed).
//
// A node that joined (--join) is given its identity whole: formed, and
// rebuilding unless it is the node a join adds before the join's stream
// stage (joinsBeforeStream), which gets its partitions by that stage: a
// replacement rebuilds.
func (n *Node) claimIdentity(m *clustermap.Map, self int, joined bool) (store.Identity, error) {
	want := store.Identity{Cluster: m.Cluster, Node: self}
	id, ok, err := n.store.Identity()
	if err != nil {
		return id, err
	}
	if ok && (id.Cluster != want.Cluster || id.Node != want.Node) {
		return id, fmt.Errorf("data directory %s belongs to node %d of cluster %016x; this is node %d of cluster %016x (another node's directory or snapshot, or a changed --cluster list)",
			n.cfg.DataDir, id.Node, id.Cluster, want.Node, want.Cluster)
	}
	if !ok {
		has, err := n.store.HasData()
		if err != nil {
			return id, err
		}
		// A directory with data but no identity is adopted, and its
		// identity recorded: nothing in it contradicts this node's, and
		// refusing it would strand its data.
		want.Created = time.Now()
		switch {
		case joined:
			want.Formed, want.FormedAt = true, want.Created
			want.Rebuilding = !has && !joinsBeforeStream(m, self)
		case !has && len(m.Nodes) > 1:
			lost, all := rebuild.Needed(n.members.View(), n.cfg.ReplicaTimeout)
			want.Rebuilding = lost
			want.Unconfirmed = !lost && !all
		}
		if err := n.store.SetIdentity(want); err != nil {
			return id, err
		}
		id = want
	}
	n.identity = &identity{store: n.store, cur: id}
	if id.Formed && id.FormedAt.IsZero() {
		// Formed under a release that did not record when: before any
		// directory this release made, as the cluster existed then
		// (formedLongAgo), so that a node wiped while the cluster
		// restarts on this release still learns it lost its disk.
		if err := n.identity.update(func(i *store.Identity) { i.FormedAt = formedLongAgo }); err != nil {
			return id, err
		}
	}
	return n.identity.get(), nil
}

// formedLongAgo is the formed time recorded for a node formed under a
// release that did not record it: earlier than any directory this
// release makes. A node with an empty directory that hears it (package
// rebuild) lost its disk: the peer saw every node answer, this one
// included, before this release ran anywhere, so this node held a
// directory then.
var formedLongAgo = time.UnixMilli(1)

// identity is the data directory's identity as the node's parts change
// it (formed, rebuilt, confirmed), written by one of them at a time: the
// rebuild's end and the probe's first full round may meet.
type identity struct {
	store *store.Store
	mu    sync.Mutex
	cur   store.Identity
}

func (i *identity) get() store.Identity {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.cur
}

// update applies change to the identity and records it durably.
func (i *identity) update(change func(*store.Identity)) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	next := i.cur
	change(&next)
	if err := i.store.SetIdentity(next); err != nil {
		return err
	}
	i.cur = next
	return nil
}

// joinsBeforeStream reports whether node self is the node m's join adds,
// with the join still in write-both: its partitions all come from the
// stream stage, which copies each from every replica of its old set.
//
// The node the join adds first starts in write-both (the stage waits for
// its acknowledgement, and it starts with an empty directory), so a node
// with that id and an empty directory at a later stage is a new machine
// that replaced it (docs/membership.md, "A member that dies during a
// change"): the stream stage may be over, or under way without it, and
// it must rebuild, from the other replicas of both sets, before it
// serves reads or acknowledges a stage. One that replaced it in
// write-both needs no rebuild: the dead joiner held only writes made
// since write-both, which reached ack replicas of the old set as well,
// and the stream stage copies those.
func joinsBeforeStream(m *clustermap.Map, self int) bool {
	ch := m.Change
	return ch != nil && ch.Kind == clustermap.Join && ch.Node == self && ch.Stage == clustermap.WriteBoth
}

// status is what /v0/status reports of the cluster parts (httpapi.Status).
type status struct{ n *Node }

func (s status) Map() (*clustermap.Map, int)    { return s.n.members.Map() }
func (s status) Rebuilding() bool               { return s.n.rebuild.Rebuilding() }
func (s status) Formed() bool                   { return s.n.probe.Formed() }
func (s status) PeerStates() []probe.PeerState  { return s.n.probe.PeerStates() }
func (s status) PendingHints() map[string]int64 { return s.n.hints.Pending() }
func (s status) NoQuorum() string               { return s.n.quorumProblem() }
func (s status) WritesFailing() string          { return s.n.writeProblem() }

// AntiEntropy is anti-entropy's state with each peer, a last complete
// exchange counted only under the cluster map this node installed last:
// one under an earlier map compared other replica sets (completeAsOf, a
// snapshot's completeness, counts them alike).
func (s status) AntiEntropy() []antientropy.PeerSync {
	out := s.n.ae.Status()
	since := s.n.members.View().Since
	for i := range out {
		if out[i].LastSuccess.Before(since) {
			out[i].LastSuccess = time.Time{}
		}
	}
	return out
}

// Warnings are what an operator must know about this node, one line each
// (empty when all is well): a store that failed a write or a data volume
// below --min-free-space (and how to free space at once), a clock off
// from the peers', a rebuild under way, partitions without a reachable
// quorum, partitions whose writes fail during a change (a node not
// started or down in one of the two replica sets), a peer whose settings differ where they must not
// (settings.go), a peer anti-entropy has not completed an exchange with
// for long.
func (s status) Warnings() []string {
	ws := s.n.store.Warnings()
	if w := s.n.probe.ClockWarning(); w != "" {
		ws = append(ws, w)
	}
	if s.n.rebuild.Unconfirmed() {
		ws = append(ws, "started with an empty data directory while not every peer answered: serving as a new cluster's node until they say whether the cluster existed before (then it rebuilds)")
	}
	if s.n.rebuild.Rebuilding() {
		ws = append(ws, "rebuilding: copying this node's share from its peers; its replica is not read until done")
	}
	if why := s.n.quorumProblem(); why != "" {
		ws = append(ws, "no quorum: "+why)
	}
	if why := s.n.writeProblem(); why != "" {
		ws = append(ws, "writes failing: "+why)
	}
	ws = append(ws, settingsWarnings(s.n.settings, s.n.probe.PeerStates())...)
	return append(ws, s.n.ae.Warnings(time.Now())...)
}

// Disk is the data volume and the store's writes (httpapi.DiskStatus).
func (s status) Disk() *client.Disk {
	sp := s.n.store.Space()
	d := &client.Disk{Dir: sp.Dir, Full: sp.Full, BallastBytes: sp.BallastBytes}
	if sp.Known {
		d.FreeBytes, d.TotalBytes, d.MinFreeBytes, d.ResumeFreeBytes = sp.Free, sp.Total, sp.MinFree, sp.ResumeAt
	}
	if sp.BallastBytes > 0 {
		d.Ballast = sp.Ballast
	}
	if err := s.n.store.Failure(); err != nil {
		d.StoreError = err.Error()
	}
	return d
}

// checkRestoredSnapshot refuses a data directory restored from a
// snapshot (store.Snapshot) that may lack a delete the others have
// collected, in a cluster of more than one node, unless
// RestoreOldSnapshot: this node would serve the deleted value again, and
// nothing would correct it. The others collect a tombstone only once its
// delete is older than their grace (and every replica had it), so a
// snapshot complete as of less than the grace ago, less the clock skew
// bound, lacks none; one whose completeness is unknown might. The grace
// is the shorter of this node's and the shortest among the cluster's
// nodes when the snapshot was taken (Snapshot.Grace: the others collect
// after their own; settings.go). It reports
// whether the directory is a restored snapshot, whose mark the node
// removes once it has accepted the directory (buildCluster), so that
// later starts are restarts.
func (n *Node) checkRestoredSnapshot(nodes int) (restored bool, err error) {
	snap, ok, err := n.store.RestoredSnapshot()
	if err != nil || !ok {
		return false, err
	}
	grace, graceIs := n.cfg.gcGrace(), "--gc-grace"
	if snap.Grace > 0 && snap.Grace < grace {
		grace, graceIs = snap.Grace, "the shortest --gc-grace among the cluster's nodes when it was taken"
	}
	bound := grace - n.cfg.MaxClockSkew
	taken := snap.Taken.UTC().Format(time.RFC3339)
	age := time.Since(snap.Complete).Round(time.Second)
	var why string
	switch {
	case nodes <= 1:
	case snap.Complete.IsZero():
		why = fmt.Sprintf("data directory %s is a snapshot taken at %s before the node had completed an anti-entropy exchange with every peer since its start: it may lack deletes the other replicas have since collected, and this node would serve the deleted values again",
			n.cfg.DataDir, taken)
	case age > bound:
		why = fmt.Sprintf("data directory %s is a snapshot taken at %s, complete as of %s, %v ago, longer than %s (%v) less --max-clock-skew (%v): the other replicas may have collected deletes made since, and this node would serve the deleted values again",
			n.cfg.DataDir, taken, snap.Complete.UTC().Format(time.RFC3339), age, graceIs, grace, n.cfg.MaxClockSkew)
	}
	switch {
	case why != "" && !n.cfg.RestoreOldSnapshot:
		return false, fmt.Errorf("%s. Start it with an empty directory instead (it rebuilds from its peers), or, when restoring every node of the cluster from its snapshots, with --restore-old-snapshot", why)
	case why != "":
		n.log.Warn("starting on a snapshot that may lack collected deletes (--restore-old-snapshot): values deleted since may come back unless every node was restored",
			"taken", taken, "why", why)
	default:
		n.log.Info("starting on a restored snapshot: anti-entropy brings it up to date with the peers", "taken", taken)
	}
	return true, nil
}

// streamKeyBytes and streamValueBytes are the least a node takes of a
// key and a value in a peer's record stream (cluster scans, partition
// copies, rebuilds), whatever its own --max-key-bytes and
// --max-value-bytes: a record within a peer's limits, or stored before a
// limit was lowered, must not stop a scan or a membership change for
// good.
const (
	streamKeyBytes   = 64 << 10
	streamValueBytes = 1 << 30
)
