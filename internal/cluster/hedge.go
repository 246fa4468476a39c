package cluster

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// When a read hedges
//
// A GET asks its first `ack` replicas and asks the others too (it hedges)
// when they have not all answered after a delay. A fixed delay fails in
// both directions: set low, a saturated cluster, where every answer is
// slow, hedges most reads, and every hedge is one more remote read on
// machines that have no CPU to spare, so latency grows and more reads
// hedge, and throughput collapses (docs/benchmarks.md); set high, a peer
// that hangs costs every read sent to it that long.
//
// So the delay follows the latency of the fastest peer: it is the 95th
// percentile of the last readWindow successful read calls to that peer
// (as in Dean and Barroso, "The Tail at Scale", hedging at the 95th
// percentile costs about 5% more reads), never less than
// --read-hedge-delay and never more than half the replica timeout.
//
//   - The whole cluster is slow (saturated): every peer's percentile is
//     high, the delay rises with it, and about 5% of reads hedge.
//   - One peer is slow or hangs: the others' percentiles stay low, and
//     reads waiting for it hedge after that short delay. Failed calls are
//     not recorded, so a peer that only times out does not count as fast,
//     and a peer that answers slowly does not raise the delay.
//   - A peer idle for readWindowTTL has no opinion: its old percentile
//     was measured under another load.

// readWindow is how many recent read latencies a peer's percentile is
// taken over; it is recomputed every readRecompute calls.
const (
	readWindow    = 256
	readRecompute = 64
	readWindowTTL = time.Second
	// hedgeRank is the 95th percentile's index in a sorted window.
	hedgeRank = readWindow * 95 / 100
)

// latencyWindow is a ring of one peer's recent read-call latencies and
// their 95th percentile, safe for concurrent use. Recording is a few atomic
// operations; every readRecompute-th recording sorts a copy of the ring
// (about 10 µs) to refresh the quantile.
type latencyWindow struct {
	samples [readWindow]atomic.Uint32 // microseconds
	n       atomic.Uint64             // samples recorded ever
	mu      sync.Mutex                // one recompute at a time
	q       atomic.Int64              // the quantile, nanoseconds
	at      atomic.Int64              // when q was computed, unix nanoseconds
}

func (w *latencyWindow) record(d time.Duration, now time.Time) {
	us := min(max(d.Microseconds(), 0), int64(^uint32(0)))
	i := w.n.Add(1)
	w.samples[i%readWindow].Store(uint32(us))
	if i%readRecompute == 0 && i >= readWindow && w.mu.TryLock() {
		w.recompute(now)
		w.mu.Unlock()
	}
}

func (w *latencyWindow) recompute(now time.Time) {
	var buf [readWindow]uint32
	for i := range buf {
		buf[i] = w.samples[i].Load()
	}
	slices.Sort(buf[:])
	w.q.Store(int64(buf[hedgeRank]) * int64(time.Microsecond))
	w.at.Store(now.UnixNano())
}

// quantile returns the window's quantile if it was computed within
// readWindowTTL of now.
func (w *latencyWindow) quantile(now time.Time) (time.Duration, bool) {
	at := w.at.Load()
	if at == 0 || now.UnixNano()-at > int64(readWindowTTL) {
		return 0, false
	}
	return time.Duration(w.q.Load()), true
}

// readHedgeDelay is how long a read waits for its first replicas before
// asking the others (see above).
func (c *Coordinator) readHedgeDelay(now time.Time) time.Duration {
	return c.readHedgeDelayOf(c.route(), now)
}

// readHedgeDelayOf is readHedgeDelay over r's peers.
func (c *Coordinator) readHedgeDelayOf(r *routes, now time.Time) time.Duration {
	d := c.hedgeDelay
	fastest := time.Duration(-1)
	for _, p := range r.peers {
		if p == nil {
			continue
		}
		if q, ok := p.readLat.quantile(now); ok && (fastest < 0 || q < fastest) {
			fastest = q
		}
	}
	if fastest > d {
		d = min(fastest, max(c.hedgeDelay, c.timeout/2))
	}
	return d
}
