// Package rebuild copies a node's share of the data from its peers after
// it started with an empty data directory, before its replica serves
// reads.
//
// A node listed in a cluster that starts with an empty data directory (a
// wiped or replaced disk) must not answer reads as an empty replica: its
// "never written" would count as an answer, and with the replicas that
// hold a key down or stale, quorum reads would answer 404 for
// acknowledged writes. So such a node first copies its share: from every
// peer it streams the records of the partitions both hold (package
// partcopy: the peer leaves out the others, so the node stores nothing
// outside its partitions) and applies them, newest version winning as for
// any write. Meanwhile:
//
//   - its replica takes writes as usual (it must not miss new ones), but
//     refuses reads, locally and from other coordinators, so a read is
//     served by the other replicas (spares are asked at once);
//   - its stream is refused to cluster scans and to other nodes' copies,
//     which then count it as a node that did not answer;
//   - /v0/status says "rebuilding".
//
// The node serves reads once every peer it shares partitions with was
// copied to its stream's end, every record of it stored; a peer that does
// not answer, or whose copy left records out (their versions too far
// ahead of this node's clock: the clock is behind), is tried again every
// retry interval. Every such peer is needed: an acknowledged write
// may be on this node and on a single other one. A peer that is
// rebuilding too (its stream is refused with rpc.ErrRebuilding) lost its
// disk as this node did, and holds no record from before its rebuild;
// but it took writes since, which may be on it and on this node alone
// (this node before it lost its disk). So its records are copied all the
// same (Copier.CopyPartial), and it counts as copied then, whatever its
// own rebuild has yet to copy: waiting for its end would deadlock two
// nodes that lost their disks together (a rack, two replaced machines),
// each waiting for the other. A partition whose every other replica is
// rebuilding has nobody to copy its older records from: what only the
// lost disks held is gone, and the node says so (a warning and
// dhtkv_rebuild_unsourced_partitions_total) rather than wait for ever.
// Nor is a member the map counts dead (view.View.Dead: a remove's
// leaving node, or one to be removed after the change under way): the
// change would wait for this node's rebuild, and the dead node would
// leave only at its end (what it alone held is lost, docs/membership.md
// "Removing a dead member"). But the remove may be aborted before its
// read-new stage, and the node is then a member again, holding what it
// held: it is copied from then, before the node serves reads if the
// abort comes first, after if not (the reads served meanwhile may miss
// what was on this node and on it alone, as they would from a replica
// that missed the writes). A restart in between forgets it: anti-entropy
// is left to compare them.
// Each copy is routed by the cluster map of its start (the partitions
// both hold in it, old set or new set while a change is under way) and
// stops when a newer map is installed, then runs again by the new one.
// The state is in the data directory's identity (store.Identity), so a
// node that stops while rebuilding resumes at its next start.
//
// Whether a node with an empty directory lost its disk is asked of its
// peers at its start (Needed): one that knows the cluster is formed, or
// routes by a newer map, says so. A node none of whose peers answers
// then (its links down, every peer restarting) cannot tell a new cluster
// from a lost disk, and goes on as a new cluster would, unconfirmed
// (Options.Unconfirmed): it asks every peer that has not answered yet
// once a second, and rebuilds as soon as one says the cluster was formed
// before the directory was made (view.PingAnswer.FormedAt, earlier than
// Options.Created by more than the clock skew bound), is of a release
// that does not say when but knows the cluster, or routes by a newer map;
// once every peer answered without, it was a new cluster. A peer
// formed since cannot say so: it saw this node answer, which this node
// did only after its directory was made. Until one answers the node
// serves its replica as whole, as it did before this rule, but only for
// as long as it reaches none of them.
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// rebuildRetry is how long a rebuild waits before asking again the peers
// whose stream failed.
const rebuildRetry = time.Second

// Copier copies every record of some partitions from another node,
// routed by the map of epoch (partcopy.Copier.Copy); CopyPartial from a
// node that rebuilds too, which then sends what it holds.
type Copier interface {
	Copy(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error)
	CopyPartial(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error)
}

// Options configures a rebuild.
type Options struct {
	// Rebuilding is whether this node's replica must copy its share
	// before serving reads (its identity says so; see Needed).
	Rebuilding bool
	// Done records that the copy finished (the node clears it in its
	// identity). nil: not recorded.
	Done func() error
	// Unconfirmed is whether this node started with an empty directory
	// while not every peer answered Needed: Start then asks them until it
	// knows whether it lost its disk (see the package comment).
	Unconfirmed bool
	// Created is when the directory was given its identity
	// (store.Identity.Created), for Unconfirmed.
	Created time.Time
	// Skew is the clock skew bound between nodes (the node's
	// --max-clock-skew): a peer formed less than Skew before Created may
	// have been formed with this node.
	Skew time.Duration
	// Timeout bounds each ping while Unconfirmed (the node's
	// --replica-timeout).
	Timeout time.Duration
	// WarnAfter is how long an unconfirmed node waits for its peers'
	// answers before it warns that they stay silent (default 30 s): in a
	// new cluster's start the members come up within seconds of each
	// other, and a wait that long is a wiped node's peers down, or a
	// member that was never started.
	WarnAfter time.Duration
	// Confirmed records what the peers said while Unconfirmed: lost, the
	// node rebuilds, which must be recorded before it does (the node sets
	// Rebuilding in its identity and clears Unconfirmed); or a new
	// cluster (it clears Unconfirmed). An error is logged, and the
	// question asked again. nil: not recorded.
	Confirmed func(lost bool) error
}

// confirmEvery is how often an unconfirmed node asks the peers that have
// not answered yet: a node that lost its disk serves its empty replica as
// whole for at most this long after the first peer that knows answers.
const confirmEvery = 250 * time.Millisecond

// Rebuilder copies the share of one node. Its methods are safe for
// concurrent use.
type Rebuilder struct {
	views      func() *view.View
	copier     Copier
	o          Options
	rebuilding atomic.Bool
	// unconfirmed: Options.Unconfirmed, until the peers said.
	unconfirmed atomic.Bool
	log         *slog.Logger
	m           *metrics
	work        *worker.Group
}

// New returns the rebuild of this node's replica from the peers of the
// views views returns, whose partitions copier copies into it. Start
// starts it when o.Rebuilding.
func New(views func() *view.View, copier Copier, o Options, log *slog.Logger) *Rebuilder {
	if o.WarnAfter <= 0 {
		o.WarnAfter = 30 * time.Second
	}
	r := &Rebuilder{views: views, copier: copier, o: o, log: log, m: newMetrics(), work: worker.New()}
	if o.Rebuilding {
		r.rebuilding.Store(true)
		r.m.rebuilding.Set(1)
	} else if o.Unconfirmed {
		r.unconfirmed.Store(true)
		r.m.unconfirmed.Set(1)
	}
	return r
}

// Register adds the instruments to reg.
func (r *Rebuilder) Register(reg prometheus.Registerer) {
	reg.MustRegister(r.m.rebuilding, r.m.unconfirmed, r.m.records, r.m.unsourced)
}

// Rebuilding reports whether the local replica is still copying its share
// (see the package comment).
func (r *Rebuilder) Rebuilding() bool { return r.rebuilding.Load() }

// Unconfirmed reports whether this node, started with an empty directory
// while not every peer answered, has yet to learn whether it lost its
// disk (see the package comment).
func (r *Rebuilder) Unconfirmed() bool { return r.unconfirmed.Load() }

// Needed pings every peer of v once and reports whether any of them knows
// the cluster exists (it has seen every node answer): a node whose
// directory is empty then lost its disk, and must rebuild. In a new
// cluster no node has seen all the others yet, so nobody waits. all
// reports whether every peer answered: if not, and none knew the cluster,
// the node cannot tell yet (Options.Unconfirmed).
//
// A peer that refuses the ping as routed by an older map than its own
// (rpc.ErrStaleEpoch) knows the cluster too: a node with an empty
// directory routes by the map its --cluster list seeds, epoch 1, and a
// member holds a later one only after a change, which only a formed
// cluster makes. (Counted as a peer that had not seen the cluster, a
// seed wiped after any join or decommission served its empty replica as
// whole.)
func Needed(v *view.View, timeout time.Duration) (lost, all bool) {
	all = true
	for _, r := range v.PingAll(v.Others(), timeout) {
		if (r.Err == nil && r.Answer.Formed) || errors.Is(r.Err, rpc.ErrStaleEpoch) {
			return true, true
		}
		all = all && r.Err == nil
	}
	return false, all
}

// Start copies every peer's records in the background, if this node is
// rebuilding; then it records that (Options.Done) and serves reads. If
// it is unconfirmed, Start asks the peers in the background until they
// said, and rebuilds if they said it lost its disk. Close stops either;
// the next start resumes.
func (r *Rebuilder) Start() {
	switch {
	case r.rebuilding.Load():
		r.work.Go(r.run)
	case r.unconfirmed.Load():
		r.work.Go(r.confirm)
	}
}

// run copies every peer's records, records the end, and serves reads;
// then it copies from the peers that were dead, should one be a member
// again (see copyPeers).
func (r *Rebuilder) run(ctx context.Context) {
	v := r.views()
	pending := map[int]string{}
	for _, i := range v.Others() {
		pending[i] = v.URL(i)
	}
	r.log.Info("rebuilding: copying this node's share from its peers before serving reads", "peers", len(pending))
	if !r.copyPeers(ctx, pending, false) {
		return // stopping
	}
	if r.o.Done != nil {
		if err := r.o.Done(); err != nil {
			r.log.Error("rebuild finished but could not be recorded; it runs again at the next start", "err", err)
		}
	}
	r.rebuilding.Store(false)
	r.m.rebuilding.Set(0)
	r.log.Info("rebuild finished: serving reads")
	if len(pending) > 0 {
		r.log.Warn("rebuild: members counted dead were not copied from; should one be a member again (its remove aborted), it is copied from then",
			"peers", slices.Collect(maps.Values(pending)))
		r.copyPeers(ctx, pending, true)
	}
}

// confirm asks every peer that has not answered yet, once a
// confirmEvery, whether the cluster was formed before this node's
// directory was made, until one says so (the node rebuilds) or every
// peer answered without (a new cluster). It warns once if they have
// not after Options.WarnAfter: before that the silence is a new
// cluster's members starting one after another.
func (r *Rebuilder) confirm(ctx context.Context) {
	r.log.Info("started with an empty data directory while not every peer answered: serving as a new cluster's node until they say whether the cluster existed before (then it rebuilds)")
	answered := map[int]bool{}
	warnAt := time.Now().Add(r.o.WarnAfter)
	for {
		lost, all := r.ask(answered)
		if !lost && !all && !warnAt.IsZero() && time.Now().After(warnAt) {
			warnAt = time.Time{}
			r.log.Warn("peers still silent: this node started with an empty data directory and cannot tell a new cluster from a lost disk until they answer; "+
				"it serves as a new cluster's node meanwhile (and rebuilds once one says the cluster existed before)",
				"waited", r.o.WarnAfter, "silent", r.silent(answered))
		}
		if lost || all {
			err := error(nil)
			if r.o.Confirmed != nil {
				err = r.o.Confirmed(lost)
			}
			if err == nil {
				r.unconfirmed.Store(false)
				r.m.unconfirmed.Set(0)
				if !lost {
					r.log.Info("every peer answered, none formed before this node's directory was made: a new cluster, nothing to rebuild")
					return
				}
				r.log.Warn("a peer knew the cluster before this node's directory was made: its disk was lost; rebuilding")
				r.rebuilding.Store(true)
				r.m.rebuilding.Set(1)
				r.run(ctx)
				return
			}
			r.log.Error("what the peers said of this node's empty directory could not be recorded; asking again", "lost", lost, "err", err)
		}
		if !r.work.Sleep(confirmEvery) {
			return
		}
	}
}

// silent returns the URLs of the current view's live peers not in
// answered.
func (r *Rebuilder) silent(answered map[int]bool) []string {
	v := r.views()
	var out []string
	for i, p := range v.Peers {
		if p != nil && !answered[i] && !v.Dead(i) {
			out = append(out, v.URL(i))
		}
	}
	return out
}

// ask pings the peers of the current view not in answered, all at once,
// adds those that answer, and reports whether one knew the cluster
// before this node's directory was made (lost) and whether every peer
// has answered (all). A member the map counts dead will not answer, and
// is not waited for.
func (r *Rebuilder) ask(answered map[int]bool) (lost, all bool) {
	v := r.views()
	var asked []int
	for i, p := range v.Peers {
		if p != nil && !answered[i] && !v.Dead(i) {
			asked = append(asked, i)
		}
	}
	replies := v.PingAll(asked, r.o.Timeout)
	all = true
	for k, rep := range replies {
		peer := asked[k]
		a, url := rep.Answer, v.URL(peer)
		switch {
		case errors.Is(rep.Err, rpc.ErrStaleEpoch):
			r.log.Info("a peer routes by a newer cluster map than this node's empty directory knows", "peer", url)
			return true, true
		case rep.Err != nil:
			all = false
			continue
		case !a.FormedAt.IsZero() && a.FormedAt.Before(r.o.Created.Add(-r.o.Skew)):
			r.log.Info("a peer was formed before this node's directory was made", "peer", url,
				"formed_at", a.FormedAt.UTC().Format(time.RFC3339Nano), "directory_made", r.o.Created.UTC().Format(time.RFC3339Nano))
			return true, true
		case a.Formed && a.Incarnation == 0:
			// A release that says neither when it was formed nor its
			// incarnation: most likely formed before, in a rolling
			// upgrade. A rebuild for nothing costs a copy; one missed
			// serves an empty replica as whole.
			r.log.Info("a peer of an earlier release knows the cluster", "peer", url)
			return true, true
		}
		answered[peer] = true
	}
	return false, all
}

// Close stops a rebuild under way.
func (r *Rebuilder) Close() { r.work.Stop() }

// copyPeers copies from every peer of pending (by id, with its URL) the
// partitions this node shares with it, and removes each from pending
// once copied or found rebuilding too (its records copied all the same),
// or once it left the cluster. A member the map counts dead is not
// waited for (the package comment says why) but stays in pending: a
// remove aborted before read-new makes it a member again, holding what
// it held, and it is copied from then. Before the node serves reads
// (late false) copyPeers returns true once only dead peers are left; after
// (late true), once none is, or a peer's id is given to another node
// (a replacement, which holds nothing of this node's writes from before
// the rebuild). It returns false when ctx ends.
func (r *Rebuilder) copyPeers(ctx context.Context, pending map[int]string, late bool) bool {
	rebuilding := map[int]bool{}      // peers rebuilding too: copied partially
	copied := map[partition.ID]bool{} // partitions copied from a peer that is not
	for {
		v := r.views()
		dead := 0
		for _, i := range slices.Sorted(maps.Keys(pending)) {
			if v.Peers[i] == nil || (late && v.URL(i) != pending[i]) { // it left the cluster meanwhile
				delete(pending, i)
				continue
			}
			if v.Dead(i) {
				dead++
				continue
			}
			shared := v.Shared(v.Self, i)
			if len(shared) == 0 {
				delete(pending, i)
				continue
			}
			copyFrom := r.copier.Copy
			if rebuilding[i] {
				copyFrom = r.copier.CopyPartial
			}
			st, err := copyFrom(ctx, v.URL(i), v.Epoch(), partition.SetOf(shared...))
			r.m.records.Add(float64(st.Records))
			if errors.Is(err, rpc.ErrRebuilding) {
				// Its records are copied all the same, now: the writes it
				// took while rebuilding (see the package comment).
				r.log.Warn("rebuild: the peer lost its disk too and rebuilds; copying what it holds, not waiting for its end", "peer", v.URL(i), "partitions", len(shared))
				rebuilding[i] = true
				continue
			}
			if err == nil && st.Refused > 0 {
				// Left where they are, too far ahead of this node's clock:
				// the copy is not complete, and may be the only other
				// replica of an acknowledged write.
				err = fmt.Errorf("%d records left out, too far ahead of this node's clock (is it behind?)", st.Refused)
			}
			if err != nil {
				if ctx.Err() != nil {
					return false
				}
				r.log.Warn("rebuild: copy from a peer failed; trying again", "peer", v.URL(i), "copied", st.Records, "err", err)
				continue
			}
			r.log.Info("rebuild: copied the partitions shared with a peer", "peer", v.URL(i), "partitions", len(shared),
				"records", st.Records, "bytes", st.Bytes, "stored", st.Applied)
			if !rebuilding[i] { // a rebuilding peer's copy lacks what it had before
				for _, p := range shared {
					copied[p] = true
				}
			}
			delete(pending, i)
		}
		if len(pending) == 0 || (!late && len(pending) == dead) {
			if !late {
				r.unsourced(rebuilding, copied)
			}
			return true
		}
		if !r.work.Sleep(rebuildRetry) {
			return false
		}
	}
}

// unsourced reports the partitions shared with the rebuilding peers that
// no other peer was copied for, by the current view: every replica of
// them but this node lost its disk.
func (r *Rebuilder) unsourced(rebuilding map[int]bool, copied map[partition.ID]bool) {
	if len(rebuilding) == 0 {
		return
	}
	v := r.views()
	lost := map[partition.ID]bool{}
	for i := range rebuilding {
		if v.Self < 0 || v.Peers[i] == nil {
			continue
		}
		for _, p := range v.Shared(v.Self, i) {
			if !copied[p] {
				lost[p] = true
			}
		}
	}
	if len(lost) == 0 {
		return
	}
	r.m.unsourced.Add(float64(len(lost)))
	r.log.Warn("rebuild: partitions whose every other replica is rebuilding too: what only the lost disks held is gone",
		"partitions", len(lost), "example", slices.Min(slices.Collect(maps.Keys(lost))))
}

// metrics are the rebuild's instruments.
type metrics struct {
	// rebuilding is 1 while the local replica copies its share.
	rebuilding prometheus.Gauge
	// unconfirmed is 1 while Rebuilder.Unconfirmed.
	unconfirmed prometheus.Gauge
	// records counts records copied by rebuilds.
	records prometheus.Counter
	// unsourced counts partitions rebuilt with no replica to copy from.
	unsourced prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		rebuilding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_rebuilding",
			Help: "1 while this node copies its share from its peers after starting with an empty data directory; its replica is not read meanwhile.",
		}),
		unconfirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_rebuild_unconfirmed",
			Help: "1 while this node, started with an empty data directory while not every peer answered, has yet to learn from them whether it lost its disk (it then rebuilds).",
		}),
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_rebuild_records_total",
			Help: "Records received from peers by rebuilds (of the partitions this node holds).",
		}),
		unsourced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_rebuild_unsourced_partitions_total",
			Help: "Partitions a rebuild found no replica to copy from: every other replica was rebuilding too (lost its disk); their records from before are lost.",
		}),
	}
}
