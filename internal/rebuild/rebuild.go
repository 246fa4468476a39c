// Package rebuild copies a node's share of the data from its peers after
// it started with an empty data directory, before its replica serves
// reads.
//
// A node listed in a cluster that starts with an empty data directory (a
// wiped or replaced disk) must not answer reads as an authoritative empty
// replica: its "never written" would count as an answer, and with the
// replicas that hold a key down or stale, quorum reads would answer 404
// for acknowledged writes. So such a node first copies its share: it
// streams every peer's records (the stream of cluster-wide scans, tombstones
// included) and applies them, newest version winning as for any write.
// Meanwhile:
//
//   - its replica takes writes as usual (it must not miss new ones), but
//     refuses reads, locally and from other coordinators, so a read is
//     served by the other replicas (spares are asked at once);
//   - its stream is refused to cluster scans, which then count it as a
//     node that did not answer;
//   - /v0/status says "rebuilding".
//
// The node serves reads once every peer's stream was copied to its end; a
// peer that does not answer is tried again every retry interval. Every
// peer is needed: an acknowledged write may be on this node and on a
// single other one. The state is in the data directory's identity
// (store.Identity), so a node that stops while rebuilding resumes at its
// next start. Records are copied to the node whatever the requests' from
// (every node holds every key at the default from, which is the cluster
// size); copying a key to a node a smaller from did not pick only costs
// its space.
package rebuild

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// rebuildBatch bounds the records applied in one store commit.
const rebuildBatch = 256

// rebuildRetry is how long a rebuild waits before asking again the peers
// whose stream failed.
const rebuildRetry = time.Second

// Streams opens another node's record stream (rpc.StreamClient.Open).
type Streams interface {
	Open(ctx context.Context, url string, epoch uint64, start, end []byte) (scan.Iterator, error)
}

// Options configures a rebuild.
type Options struct {
	// Rebuilding is whether this node's replica must copy its share
	// before serving reads (its identity says so; see Needed).
	Rebuilding bool
	// Done records that the copy finished (the node clears it in its
	// identity). nil: not recorded.
	Done func() error
}

// Rebuilder copies the share of one node. Its methods are safe for
// concurrent use.
type Rebuilder struct {
	local      *replica.Replica
	views      func() *view.View
	streams    Streams
	o          Options
	rebuilding atomic.Bool
	log        *slog.Logger
	m          *metrics
	work       *worker.Group
}

// New returns the rebuild of local from the peers of the views views
// returns, whose streams it opens with streams. Start starts it when
// o.Rebuilding.
func New(local *replica.Replica, views func() *view.View, streams Streams, o Options, log *slog.Logger) *Rebuilder {
	r := &Rebuilder{local: local, views: views, streams: streams, o: o, log: log, m: newMetrics(), work: worker.New()}
	if o.Rebuilding {
		r.rebuilding.Store(true)
		r.m.rebuilding.Set(1)
	}
	return r
}

// Register adds the instruments to reg.
func (r *Rebuilder) Register(reg prometheus.Registerer) {
	reg.MustRegister(r.m.rebuilding, r.m.records)
}

// Rebuilding reports whether the local replica is still copying its share
// (see the package comment).
func (r *Rebuilder) Rebuilding() bool { return r.rebuilding.Load() }

// Needed pings every peer of v once and reports whether any of them knows
// the cluster exists (it has seen every node answer): a node whose
// directory is empty then lost its disk, and must rebuild. In a new
// cluster no node has seen all the others yet, so nobody waits.
func Needed(v *view.View, timeout time.Duration) bool {
	for _, p := range v.Peers {
		if p == nil {
			continue
		}
		if formed, err := p.Ping(v.Epoch(), time.Now().Add(timeout)); err == nil && formed {
			return true
		}
	}
	return false
}

// Start copies every peer's records in the background, if this node is
// rebuilding; then it records that (Options.Done) and serves reads. Close
// stops it; the next start resumes.
func (r *Rebuilder) Start() {
	if !r.rebuilding.Load() {
		return
	}
	r.work.Go(func(ctx context.Context) {
		if !r.copyPeers(ctx) {
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
	})
}

// Close stops a rebuild under way.
func (r *Rebuilder) Close() { r.work.Stop() }

// copyPeers streams every peer's records into the local replica until all
// were copied (true) or ctx ends (false).
func (r *Rebuilder) copyPeers(ctx context.Context) bool {
	pending := map[int]bool{}
	for _, i := range r.views().Others() {
		pending[i] = true
	}
	r.log.Info("rebuilding: copying this node's share from its peers before serving reads", "peers", len(pending))
	for {
		v := r.views()
		for i := range pending {
			if v.Peers[i] == nil { // it left the cluster meanwhile
				delete(pending, i)
				continue
			}
			n, err := r.copyFrom(ctx, v.URL(i))
			r.m.records.Add(float64(n))
			if err != nil {
				r.log.Warn("rebuild: copy from a peer failed; trying again", "peer", v.URL(i), "copied", n, "err", err)
				continue
			}
			r.log.Info("rebuild: copied a peer's records", "peer", v.URL(i), "records", n)
			delete(pending, i)
		}
		if len(pending) == 0 {
			return true
		}
		if !r.work.Sleep(rebuildRetry) {
			return false
		}
	}
}

// copyFrom applies peer i's whole stream to the local replica and returns
// how many records it applied.
func (r *Rebuilder) copyFrom(ctx context.Context, url string) (int, error) {
	it, err := r.streams.Open(ctx, url, r.views().Epoch(), []byte{0}, nil) // "\x00": every non-empty key
	if err != nil {
		return 0, err
	}
	defer it.Close()
	var writes []store.Write
	var recs []record.Record
	var outcomes []replica.Outcome
	applied := 0
	flush := func() error {
		if len(writes) == 0 {
			return nil
		}
		for j := range writes {
			writes[j].Rec = &recs[j] // recs no longer grows: the pointers hold
		}
		// As for any replicated write (replica.ApplyRemote): a version too
		// far ahead of this clock is left out, as a replica refuses it.
		var err error
		if outcomes, err = r.local.ApplyRemote(writes, outcomes); err != nil {
			return err
		}
		for _, o := range outcomes {
			switch {
			case o.Refused != nil:
				r.log.Warn("rebuild: record left out", "peer", url, "err", o.Refused)
			case o.Applied():
				applied++
			}
		}
		writes, recs = writes[:0], recs[:0]
		return nil
	}
	for it.Next() {
		env := bytes.Clone(it.Envelope()) // the stream reuses its buffers
		rec, err := record.Decode(env)
		if err != nil {
			return applied, err
		}
		writes = append(writes, store.Write{Key: bytes.Clone(it.Key())})
		recs = append(recs, rec)
		if len(writes) == rebuildBatch {
			if err := flush(); err != nil {
				return applied, err
			}
		}
	}
	if err := it.Err(); err != nil {
		return applied, fmt.Errorf("stream from %s: %w", url, err)
	}
	return applied, flush()
}

// metrics are the rebuild's instruments.
type metrics struct {
	// rebuilding is 1 while the local replica copies its share.
	rebuilding prometheus.Gauge
	// records counts records copied by rebuilds.
	records prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		rebuilding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_rebuilding",
			Help: "1 while this node copies its share from its peers after starting with an empty data directory; its replica is not read meanwhile.",
		}),
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_rebuild_records_total",
			Help: "Records copied from peers by rebuilds.",
		}),
	}
}
