package rpc

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// A peer that leaves a batch unanswered for at least half the replica
// timeout turns silent: from then on its calls fail at once, with
// ErrSilent (an ErrTimeout), without a request (a write's coordinator
// keeps a hint for it at once, a read starts a spare replica at once),
// and one goroutine pings it, one ping at a time, no more often than once
// a timeout, until it answers. The first answer ends the silence.
//
// Why: without it every batch to a peer that stopped answering (a
// stopped process, a frozen VM, a blackholed link) waits out its
// deadline on a connection of its own, and is then abandoned there:
// fasthttp closes the connection, but a frozen node's kernel has already
// taken the request into its socket. A node paused for about 20 s under
// 8,000 writes a second found 4,000 such connections and 200 MB of
// batches when it ran again (docs/benchmarks.md section 49), and
// reading them cost every request of the cluster the next seconds.
// Cassandra does the same by its failure detector: a write to a replica
// it holds down goes to a hint without being sent.
//
// What trips it, and what does not:
//
//   - Half the timeout, not any timeout: a batch goes out with the
//     earliest deadline of its calls, and a call that queued long leaves
//     its batch little time, so a short wait says nothing of the peer. A
//     healthy peer answers in about a millisecond.
//   - Only an exchange that got no answer: any status (a late batch's
//     504, a stale map's 409) is an answer.
//   - Not an exchange that came back well after its deadline (a quarter
//     of the timeout or more): this process was not running (paused, or
//     starved of CPU), and the answer may be in its socket unread.
//   - Not a wait for a free connection of this node's own pool.
//   - Not the background lane's batches (anti-entropy's reads), which
//     may carry large answers to a busy peer.
//
// A silence nobody asks about ends too: when a whole round of silentIdle
// timeouts passes with no call failed by it, the prober stops and the
// silence ends without an answer. A member that left the cluster (whose
// Peer the node keeps) is then not pinged for the rest of the process's
// life; a peer that is still silent costs the next call one timeout,
// which makes it silent again.
//
// A spurious trip costs the calls queued for the peer at that moment and
// those made until the first ping answers (about a round trip when the
// peer is in fact healthy): they fail instead of waiting, writes among
// them become hints, and reads go to a spare replica.
//
// Invariant: silence.since is set only by the CompareAndSwap in
// noteUnanswered, whose winner starts the one prober, and cleared only
// by that prober, as its last act (on an answer, or idle): at most one
// prober runs, and a silent peer always has one (or is closed).

// ErrSilent fails a call to a silent peer without sending it. It is an
// ErrTimeout: for its caller the peer did not answer in time.
var ErrSilent = fmt.Errorf("%w: the peer is silent", ErrTimeout)

// silentIdle is how many of the prober's rounds (a timeout each) may
// pass with no call failed by the silence before the silence ends
// unanswered.
const silentIdle = 3

// peerSilence is a Peer's silence, with its instruments.
type peerSilence struct {
	since      atomic.Pointer[time.Time] // nil: the peer answers
	asked      atomic.Uint64             // calls failed by it since the prober's last round
	gauge      prometheus.Gauge
	silences   prometheus.Counter
	failedFast prometheus.Counter
}

// silentErr fails n calls to a silent peer, or is nil.
func (p *Peer) silentErr(n int) error {
	since := p.silence.since.Load()
	if since == nil {
		return nil
	}
	p.silence.failedFast.Add(float64(n))
	p.silence.asked.Add(uint64(n))
	return fmt.Errorf("%w: %s has not answered for %v (a batch went unanswered; calls fail at once until it answers a ping)",
		ErrSilent, p.url, time.Since(*since).Round(time.Millisecond))
}

// noteUnanswered is told that an exchange begun at start, with the
// given deadline and epoch, failed with err, a timeout (classify): the
// peer turns silent if it had half the timeout to answer and this
// process ran meanwhile (see above).
func (p *Peer) noteUnanswered(start, deadline time.Time, epoch uint64, err error) {
	now := time.Now()
	if now.Sub(start) < p.timeout/2 || now.Sub(deadline) >= p.timeout/4 || errors.Is(err, fasthttp.ErrNoFreeConns) {
		return
	}
	if !p.silence.since.CompareAndSwap(nil, &now) {
		return
	}
	p.silence.gauge.Set(1)
	p.silence.silences.Inc()
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		p.silence.gauge.Set(0) // nothing is sent any more, and no prober waits
		return
	}
	p.senders.Add(1) // the caller is a sender: the count is above zero, and Close waits after closed is set
	go p.probeSilent(epoch)
}

// probeSilent pings the silent peer until it answers or no call asks for
// silentIdle rounds (either ends the silence), or the Peer closes.
func (p *Peer) probeSilent(epoch uint64) {
	defer p.senders.Done()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}()
	wait := time.NewTimer(0)
	defer wait.Stop()
	p.silence.asked.Store(0)
	idle := 0
	for {
		select {
		case <-p.stop:
			p.silence.gauge.Set(0) // closed: nothing is sent any more
			return
		case <-wait.C:
		}
		start := time.Now()
		if p.answers(req, resp, epoch, start.Add(p.timeout)) {
			p.endSilence()
			return
		}
		if p.silence.asked.Swap(0) == 0 {
			idle++
		} else {
			idle = 0
		}
		if idle >= silentIdle {
			p.endSilence()
			return
		}
		// A refused connect fails at once: the next ping waits out the
		// rest of a timeout.
		wait.Reset(max(0, time.Until(start.Add(p.timeout))))
	}
}

// endSilence is the prober's last act. The gauge first: once since is
// cleared, another silence may begin and set it.
func (p *Peer) endSilence() {
	p.silence.gauge.Set(0)
	p.silence.since.Store(nil)
}

// answers sends the peer an empty batch (a ping) and reports whether any
// answer came back by deadline: a refusal, a stale map's 409 or an
// error status is an answer too, and the calls that follow learn what
// it means.
func (p *Peer) answers(req *fasthttp.Request, resp *fasthttp.Response, epoch uint64, deadline time.Time) bool {
	p.batchRequest(req, epoch)
	resp.Reset()
	return p.exchange(req, resp, deadline) == nil
}
