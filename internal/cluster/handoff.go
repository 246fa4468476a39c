package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Hinted handoff
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

// HandoffOptions configures hinted handoff. Zero fields take the defaults
// noted.
type HandoffOptions struct {
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
}

func (o *HandoffOptions) defaults() {
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
}

// replayConcurrency is how many hints are in flight to one target at once:
// the peer client batches concurrent calls into one request.
const replayConcurrency = 64

type handoff struct {
	c     *Coordinator
	store *store.Store
	o     HandoffOptions
	limit *rate.Limiter

	mu      sync.Mutex
	pending map[int]int64 // hint bytes per target

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
	m      *handoffMetrics
}

func newHandoff(c *Coordinator, st *store.Store, o HandoffOptions) (*handoff, error) {
	o.defaults()
	pending, err := st.HintBytes()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &handoff{
		c: c, store: st, o: o, pending: pending, ctx: ctx, cancel: cancel, m: newHandoffMetrics(),
		// A second's worth at most goes out at once; a larger hint waits
		// for a full bucket (see send).
		limit: rate.NewLimiter(rate.Limit(o.ReplayRate), int(o.ReplayRate)),
	}
	v := c.v()
	for target, n := range pending {
		if target > membership.MaxNodeID {
			return nil, fmt.Errorf("hints stored for node %d, beyond the largest node id %d", target, membership.MaxNodeID)
		}
		// Hints for a node that left are dropped at the first delivery.
		h.m.pending.WithLabelValues(v.url(target)).Set(float64(n))
	}
	return h, nil
}

// start runs the delivery loop; close stops it.
func (h *handoff) start() {
	h.done.Add(1)
	go h.run()
}

// add keeps a hint of the write env under key for target, whose replica
// call failed with err. It runs on the replica call's goroutine.
func (h *handoff) add(target int, key, env []byte) {
	hint := store.Hint{Target: target, Key: key, Envelope: env}
	peer := h.c.v().url(target)
	size := int64(hint.Size())
	h.mu.Lock()
	if h.pending[target]+size > h.o.MaxBytes {
		h.mu.Unlock()
		h.m.dropped.WithLabelValues(peer, "cap").Inc()
		h.c.ae.soon(target) // it repairs what the hint carried
		return
	}
	h.pending[target] += size // reserved before the write, so concurrent adds respect the cap
	h.mu.Unlock()
	if err := h.store.AddHint(hint); err != nil {
		h.addPending(target, -size)
		h.m.dropped.WithLabelValues(peer, "error").Inc()
		h.c.log.Error("store hint", "peer", peer, "err", err)
		h.c.ae.soon(target)
		return
	}
	h.m.stored.WithLabelValues(peer).Inc()
	h.m.pending.WithLabelValues(peer).Set(float64(h.addPending(target, 0)))
}

func (h *handoff) addPending(target int, n int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending[target] += n
	if h.pending[target] <= 0 {
		delete(h.pending, target)
		return 0
	}
	return h.pending[target]
}

func (h *handoff) run() {
	defer h.done.Done()
	t := time.NewTicker(h.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
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
}

// deliver sends target's hints, oldest first, until none is left or one
// fails. Each pass reads a bounded slice of hints, so memory stays bounded
// whatever the backlog.
//
// A node that left the cluster gets none: its hints are dropped (it holds
// no partition any more, and the records reached the new replicas by the
// move). The hints are read by the view current at each slice.
func (h *handoff) deliver(target int) {
	peer := h.c.v().url(target)
	var cursor *store.Hint // the last hint handled: the next slice starts past it
	for h.ctx.Err() == nil {
		v := h.c.v()
		gone := v.peers[target] == nil
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
			h.c.log.Error("read hints", "peer", peer, "err", err)
			return
		}
		h.forget(target, expired, "window")
		if gone {
			h.forget(target, batch, "left")
			batch = nil
		}
		if len(batch) == 0 {
			if len(expired) == 0 {
				return
			}
			continue
		}
		delivered, failed := h.send(v, target, batch)
		h.forget(target, delivered, "")
		if failed != nil {
			h.c.log.Debug("hint delivery failed; next interval", "peer", peer, "err", failed)
			return
		}
	}
}

// send delivers batch concurrently and returns the hints acknowledged and
// the first failure.
func (h *handoff) send(v *view, target int, batch []store.Hint) (delivered []store.Hint, failed error) {
	p := v.peers[target]
	ok := make([]bool, len(batch))
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, hint := range batch {
		if err := h.limit.WaitN(h.ctx, min(hint.Size(), h.limit.Burst())); err != nil {
			break // stopping
		}
		wg.Go(func() {
			_, err := p.client.Apply(hint.Key, hint.Envelope, v.m.Epoch, time.Now().Add(h.c.timeout))
			ok[i], errs[i] = err == nil, err
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
func (h *handoff) forget(target int, hs []store.Hint, reason string) {
	if len(hs) == 0 {
		return
	}
	peer := h.c.v().url(target)
	if err := h.store.DeleteHints(hs); err != nil {
		h.c.log.Error("delete hints", "peer", peer, "err", err)
		return
	}
	var size int64
	for _, hint := range hs {
		size += int64(hint.Size())
	}
	h.m.pending.WithLabelValues(peer).Set(float64(h.addPending(target, -size)))
	if reason == "" {
		h.m.replayed.WithLabelValues(peer).Add(float64(len(hs)))
	} else {
		h.m.dropped.WithLabelValues(peer, reason).Add(float64(len(hs)))
		h.c.ae.soon(target)
	}
}

// close stops the loop; hints not yet delivered stay stored for the next
// start.
func (h *handoff) close() {
	h.cancel()
	h.done.Wait()
}

// PendingHints returns the bytes of hints held for each node, by URL.
func (c *Coordinator) PendingHints() map[string]int64 {
	v := c.v()
	h := c.handoff
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int64, len(h.pending))
	for target, n := range h.pending {
		out[v.url(target)] = n
	}
	return out
}
