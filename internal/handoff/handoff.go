// Package handoff keeps the writes a replica missed and delivers them when
// it answers again (hinted handoff).
//
// A replicated write that fails or times out on one replica leaves that
// replica behind. The coordinator keeps the write as a hint, durably in
// its own store (store.AddHint), and delivers it when the replica answers
// again: every interval the handoff loop sends each target's hints, oldest
// first, throttled to a byte rate, and deletes each once the replica
// acknowledged it (applied, or refused because it already holds something
// newer). A target that fails a delivery is tried again next interval.
//
// Hints never count towards ack: one is stored only after its replica
// failed. They are a shortcut, not a guarantee: a hint older than the
// window, or one that would take its target's hints over the byte cap, is
// dropped and counted, and anti-entropy repairs what it carried. The
// window also keeps a long-dead node from coming back to hours of stale
// writes all at once, and (with tombstone collection) from replaying a
// write older than a purged delete.
package handoff

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/sizeflag"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Options configures hinted handoff. Zero fields take the defaults noted
// (EnsureDefaults).
type Options struct {
	// Window is how old a hint may get before it is dropped (--hint-window;
	// default 3 h). Age is the hinted write's version time.
	Window time.Duration
	// MaxBytes caps the hints kept for one target (--hint-max-bytes;
	// default 256 MiB); a hint beyond it is dropped.
	MaxBytes int64
	// ReplayRate is the most hint bytes per second sent to all targets
	// together (--hint-replay-rate; default 4 MiB/s), so a returning node
	// is not flooded while it also serves clients.
	ReplayRate int64
	// Interval is how often the loop looks for hints to deliver (default
	// 1 s).
	Interval time.Duration
	// Timeout is one delivery call's deadline (the node's
	// --replica-timeout; default 300 ms).
	Timeout time.Duration
}

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Window, "hint-window", o.Window, "drop hints (writes kept for a replica that missed them) older than this; anti-entropy repairs what they carried")
	sizeflag.Var(fs, &o.MaxBytes, "hint-max-bytes", "most hints kept for one replica, a `size`")
	sizeflag.Var(fs, &o.ReplayRate, "hint-replay-rate", "most hints delivered to returning replicas per second, a `size`")
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.Window <= 0 || o.MaxBytes <= 0 || o.ReplayRate <= 0 {
		return errors.New("--hint-window, --hint-max-bytes and --hint-replay-rate must be positive")
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Window <= 0 {
		o.Window = 3 * time.Hour
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 256 << 20
	}
	if o.ReplayRate <= 0 {
		o.ReplayRate = 4 << 20
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
}

// replayConcurrency is how many hints are in flight to one target at once:
// the peer client batches concurrent calls into one request.
const replayConcurrency = 64

// Handoff keeps hints in this node's store and delivers them. Its methods
// are safe for concurrent use.
type Handoff struct {
	views   func() *view.View
	store   *store.Store
	dropped func(target int)
	o       Options
	limit   *rate.Limiter
	log     *slog.Logger
	m       *metrics
	work    *worker.Group
	// exported is the view whose peers' series exportPeers last created
	// (Start, then the delivery loop only).
	exported *view.View

	mu      sync.Mutex
	pending map[int]int64 // hint bytes per target

	stripes [64]sync.Mutex // Add's, by hintStripe
}

// hintStripe is the stripe of Handoff.stripes that the hints of key for
// target take.
func hintStripe(target int, key []byte) int {
	x := uint32(2166136261) ^ uint32(target)
	for _, b := range key {
		x = (x ^ uint32(b)) * 16777619
	}
	return int(x % 64)
}

// New returns the handoff of the hints in st, routed by the views views
// returns. dropped is called with a target whose hint was dropped:
// anti-entropy must then repair what it carried. It reads how many hints
// st holds; Start starts the delivery.
func New(st *store.Store, views func() *view.View, dropped func(target int), o Options, log *slog.Logger) (*Handoff, error) {
	o.EnsureDefaults()
	pending, err := st.HintBytes()
	if err != nil {
		return nil, err
	}
	h := &Handoff{
		views: views, store: st, dropped: dropped, o: o, pending: pending, log: log, m: newMetrics(), work: worker.New(),
		// A second's worth at most goes out at once; a larger hint waits
		// for a full bucket (see send).
		limit: rate.NewLimiter(rate.Limit(o.ReplayRate), int(o.ReplayRate)),
	}
	v := views()
	for target, n := range pending {
		if target > clustermap.MaxNodeID {
			return nil, fmt.Errorf("hints stored for node %d, beyond the largest node id %d", target, clustermap.MaxNodeID)
		}
		// Hints for a node that left are dropped at the first delivery.
		h.m.pending.WithLabelValues(v.URL(target)).Set(float64(n))
	}
	return h, nil
}

// Limiter is the replay's rate limiter (ReplayRate), for the node's
// background pace (package pace) to govern.
func (h *Handoff) Limiter() *rate.Limiter { return h.limit }

// Register adds the instruments to reg, and the cap on one peer's hints
// (dhtkv_hints_max_bytes, --hint-max-bytes) for dashboards to draw
// dhtkv_hints_pending_bytes against.
func (h *Handoff) Register(reg prometheus.Registerer) {
	h.m.register(reg)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dhtkv_hints_max_bytes",
		Help: "The most bytes of hints kept for one peer (--hint-max-bytes); beyond, hints are dropped (reason cap).",
	}, func() float64 { return float64(h.o.MaxBytes) }))
}

// Start runs the delivery loop; Close stops it.
func (h *Handoff) Start() {
	h.exportPeers()
	h.work.Tick(h.o.Interval, h.round)
}

// dropReasons are the label values of dhtkv_hints_dropped_total's reason.
var dropReasons = []string{"window", "cap", "error", "left"}

// exportPeers creates the series of every peer of the installed view, at
// 0, if not done for this view yet: a panel of hints shows every peer at
// 0 before its first hint rather than "No data". A peer that joins gets
// them within a round of the loop.
func (h *Handoff) exportPeers() {
	v := h.views()
	if v == h.exported {
		return
	}
	h.exported = v
	for _, id := range v.Others() {
		peer := v.URL(id)
		h.m.stored.WithLabelValues(peer)
		h.m.replayed.WithLabelValues(peer)
		h.m.pending.WithLabelValues(peer)
		for _, r := range dropReasons {
			h.m.dropped.WithLabelValues(peer, r)
		}
	}
}

// Add keeps a hint of the write env under key for target, whose replica
// call failed. It runs on the replica call's goroutine; key and env are
// kept, and must not be modified after.
func (h *Handoff) Add(target int, key, env []byte) {
	hint := store.Hint{Target: target, Key: key, Envelope: env}
	peer := h.views().URL(target)
	size := int64(hint.Size())
	// The same write hinted again for the same target (a write routed
	// again with its version after the view changed) is the same stored
	// hint: its bytes are reserved once. The stripe keeps two adds of it
	// from both finding it absent.
	stripe := &h.stripes[hintStripe(target, key)]
	stripe.Lock()
	defer stripe.Unlock()
	if held, err := h.store.HasHint(hint); err == nil && held {
		return
	}
	h.mu.Lock()
	if h.pending[target]+size > h.o.MaxBytes {
		h.mu.Unlock()
		h.m.dropped.WithLabelValues(peer, "cap").Inc()
		h.dropped(target) // it repairs what the hint carried
		return
	}
	h.pending[target] += size // reserved before the write, so concurrent adds respect the cap
	h.mu.Unlock()
	if err := h.store.AddHint(hint); err != nil {
		h.addPending(target, -size)
		h.m.dropped.WithLabelValues(peer, "error").Inc()
		h.log.Error("store hint", "peer", peer, "err", err)
		h.dropped(target)
		return
	}
	h.m.stored.WithLabelValues(peer).Inc()
	h.m.pending.WithLabelValues(peer).Set(float64(h.addPending(target, 0)))
}

func (h *Handoff) addPending(target int, n int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending[target] += n
	if h.pending[target] <= 0 {
		delete(h.pending, target)
		return 0
	}
	return h.pending[target]
}

// round offers every target its hints. A store that failed a write
// (store.Store.Failure) delivers none: it could not delete a delivered
// hint, and would send the same ones again every round.
func (h *Handoff) round(context.Context) {
	h.exportPeers()
	if h.store.Failure() != nil {
		return
	}
	h.mu.Lock()
	var targets []int
	for target := range h.pending {
		targets = append(targets, target)
	}
	h.mu.Unlock()
	for _, target := range targets {
		h.deliver(target)
	}
}

// deliver sends target's hints, oldest first, until none is left or one
// fails. Each pass reads a bounded slice of hints, so memory stays bounded
// whatever the backlog.
//
// A node that left the cluster gets none: its hints are dropped (it holds
// no partition any more, and the records reached the new replicas by the
// move). Nor does a member that no longer receives the hint's partition
// (placement.Sets.Receives): a change moved it away while the hint
// waited, and the node dropped it at the change's end; delivered, the
// record would stay there outside its partitions, never updated again
// (no write, repair or exchange reaches it), and a later change handing
// the partition back would bring the old value back. Such a hint
// carries nothing to repair either: the write reached the new set's
// replicas, or failed. The hints are read by the view current at each
// slice, and sent with its epoch: a target that installed a newer map
// refuses them, and the next slice reads them by that map; one that
// applies them at this epoch drops them with the partition if a newer
// map moves it.
func (h *Handoff) deliver(target int) {
	peer := h.views().URL(target)
	var cursor *store.Hint // the last hint handled: the next slice starts past it
	for !h.work.Stopping() {
		v := h.views()
		gone := v.Peers[target] == nil
		var batch []store.Hint
		var expired []store.Hint
		oldest := hlc.VersionAt(time.Now().Add(-h.o.Window))
		err := h.store.Hints(target, cursor, func(hint store.Hint) bool {
			cursor = &hint
			if hint.Version() < oldest {
				expired = append(expired, hint)
			} else {
				batch = append(batch, hint)
			}
			return len(batch)+len(expired) < replayConcurrency
		})
		if err != nil {
			h.log.Error("read hints", "peer", peer, "err", err)
			return
		}
		h.forget(target, expired, "window")
		if gone {
			h.forget(target, batch, "left")
			batch = nil
		}
		var moved []store.Hint
		batch = slices.DeleteFunc(batch, func(hint store.Hint) bool {
			part, _ := partition.Of(hint.Key)
			if v.Receives(part, target) {
				return false
			}
			moved = append(moved, hint)
			return true
		})
		h.forget(target, moved, "moved")
		if len(batch) == 0 {
			if len(expired) == 0 && len(moved) == 0 {
				return
			}
			continue
		}
		delivered, failed := h.send(v, target, batch)
		h.forget(target, delivered, "")
		if failed != nil {
			h.log.Debug("hint delivery failed; next interval", "peer", peer, "err", failed)
			return
		}
	}
}

// send delivers batch concurrently and returns the hints acknowledged and
// the first failure.
func (h *Handoff) send(v *view.View, target int, batch []store.Hint) (delivered []store.Hint, failed error) {
	p := v.Peers[target]
	ok := make([]bool, len(batch))
	errs := make([]error, len(batch))
	// The first call the target does not answer stops the slice: the
	// hints not started yet take none of the replay rate, which all
	// targets share (a target that is down must not spend it on calls
	// that fail at once), and a wait for it ends (a cancelled wait gives
	// its tokens back). A refusal of one hint (its version too far ahead
	// of the target's clock, say) is that hint's: the others go on.
	ctx, stop := context.WithCancel(h.work.Context())
	defer stop()
	var wg sync.WaitGroup
	for i, hint := range batch {
		if err := h.limit.WaitN(ctx, min(hint.Size(), h.limit.Burst())); err != nil {
			break // stopping, or one failed
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			_, err := p.Apply(hint.Key, hint.Envelope, v.Epoch(), time.Now().Add(h.o.Timeout))
			ok[i], errs[i] = err == nil, err
			if err != nil && !rpc.IsRefused(err) {
				stop() // no answer: the others would fail alike
			}
		})
	}
	wg.Wait()
	for i, hint := range batch {
		if ok[i] {
			delivered = append(delivered, hint)
		}
	}
	return delivered, errors.Join(errs...)
}

// forget deletes hints delivered (reason "") or dropped.
func (h *Handoff) forget(target int, hs []store.Hint, reason string) {
	if len(hs) == 0 {
		return
	}
	peer := h.views().URL(target)
	if err := h.store.DeleteHints(hs); err != nil {
		h.log.Error("delete hints", "peer", peer, "err", err)
		return
	}
	var size int64
	for _, hint := range hs {
		size += int64(hint.Size())
	}
	h.m.pending.WithLabelValues(peer).Set(float64(h.addPending(target, -size)))
	switch reason {
	case "":
		h.m.replayed.WithLabelValues(peer).Add(float64(len(hs)))
	case "moved": // nothing to repair: the target no longer holds them
		h.m.dropped.WithLabelValues(peer, reason).Add(float64(len(hs)))
	default:
		h.m.dropped.WithLabelValues(peer, reason).Add(float64(len(hs)))
		h.dropped(target)
	}
}

// Close stops the loop; hints not yet delivered stay stored for the next
// start.
func (h *Handoff) Close() { h.work.Stop() }

// Pending returns the bytes of hints held for each node, by URL.
func (h *Handoff) Pending() map[string]int64 {
	v := h.views()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int64, len(h.pending))
	for target, n := range h.pending {
		out[v.URL(target)] = n
	}
	return out
}
