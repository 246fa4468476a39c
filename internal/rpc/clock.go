package rpc

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/view"
)

// TimeHeader carries, on every batch answer, the answering node's clock
// (the one its versions are made from) in Unix microseconds. The asking
// node compares it with its own to measure how far apart their clocks are,
// at no extra cost: no node-to-node exchange is added for it.
const TimeHeader = "X-Dhtkv-Time"

// AppendTime appends this node's clock, as TimeHeader carries it, to dst.
func (s *Server) AppendTime(dst []byte) []byte {
	return strconv.AppendInt(dst, s.Replica.Clock.Wall().UnixMicro(), 10)
}

// clockOffset is the last measurement of a peer's clock against this
// node's: the peer's time minus the midpoint of the exchange, so its
// error is at most half the round trip. The offset and its error are
// packed in one word: the offset in microseconds in the high
// 64-errorBits bits (signed: ±100 days), the error in the low errorBits.
// A measurement's words are stored under a sequence number (a seqlock),
// so a reader never pairs one measurement's offset with another's time
// or clock reading, and nothing is allocated per exchange. Reads are a
// probe round's, a few a second; writes one per exchange, each a few
// stores long: a reader that meets one reads again.
type clockOffset struct {
	// seq is odd while a measurement is being stored; a reader that sees
	// it odd, or changed across its reads, reads again. A writer that
	// finds it odd keeps its measurement out: another as fresh is being
	// stored.
	seq    atomic.Uint64
	sample atomic.Uint64
	// base is when the first measurement was made, and at when the last
	// was, in nanoseconds after base, plus 1 (0: never). Both from
	// time.Now, with its monotonic reading: a reader that asks how old
	// the sample is (ClockSample.At) gets the same answer after this
	// host's wall clock is stepped, so a step back does not make an old
	// sample of a silent peer count as fresh.
	base atomic.Pointer[time.Time]
	at   atomic.Int64
	// wall is this node's clock when the answer came (Unix ns):
	// ClockSample.Wall; wallErr how far from at's instant it may have
	// been read (ns): ClockSample.WallErr.
	wall, wallErr atomic.Int64
}

// errorBits holds an error up to about a second: a measurement over a
// round trip longer than two seconds says too little to be kept.
const errorBits = 20

// measured records the peer's clock, peer, read off an exchange sent at
// sent and answered at got (both this node's clock).
func (o *clockOffset) measured(peer, sent, got time.Time) {
	o.measuredAfter(peer, sent, got, time.Time{})
}

// measuredAfter is measured, where before is time.Now just before got
// was read (zero: not known): the sample's At is then the midpoint of
// before and measured's own time.Now, and its WallErr half their
// distance, so that a goroutine descheduled between the reading of got
// and time.Now's is no step of this clock (probe's renew).
func (o *clockOffset) measuredAfter(peer, sent, got, before time.Time) {
	// The wall readings, not the monotonic ones: a step of this clock
	// during the exchange (settimeofday moves the wall, not the monotonic
	// reading) must not pair the peer's time with the wall from before it.
	rtt := got.Round(0).Sub(sent.Round(0))
	errMicros := (rtt.Microseconds() + 1) / 2
	if rtt < 0 || errMicros >= 1<<errorBits || (got.Sub(sent)-rtt).Abs() > time.Millisecond {
		return // the clock stepped meanwhile, or too slow to tell
	}
	mid := sent.Round(0).Add(rtt / 2)
	// Beyond what the word holds, the offset saturates: wrapped around,
	// a clock off by 2^44 µs (about 203.6 days) would read as in
	// agreement.
	const maxOff = 1<<(63-errorBits) - 1
	off := min(max(peer.UnixMicro()-mid.UnixMicro(), -maxOff), maxOff)
	now := time.Now() // local time: this clock may be the one off
	var wallErr time.Duration
	if !before.IsZero() {
		d := now.Sub(before)
		now, wallErr = before.Add(d/2), d/2
	}
	base := o.base.Load()
	if base == nil {
		first := now
		o.base.CompareAndSwap(nil, &first) // once a peer
		base = o.base.Load()
	}
	q := o.seq.Load()
	if q&1 == 1 || !o.seq.CompareAndSwap(q, q+1) {
		return
	}
	o.sample.Store(uint64(off)<<errorBits | uint64(errMicros))
	o.at.Store(int64(now.Sub(*base)) + 1)
	o.wall.Store(got.Round(0).UnixNano())
	o.wallErr.Store(int64(wallErr))
	o.seq.Store(q + 2)
}

// get returns the last measurement; ok is false before any.
func (o *clockOffset) get() (s view.ClockSample, ok bool) {
	for {
		q := o.seq.Load()
		if q&1 == 1 {
			runtime.Gosched() // a writer is between its stores
			continue
		}
		ns, w, wall, wallErr := o.at.Load(), o.sample.Load(), o.wall.Load(), o.wallErr.Load()
		base := o.base.Load() // stored before at
		if o.seq.Load() != q {
			continue
		}
		if ns == 0 {
			return view.ClockSample{}, false
		}
		return view.ClockSample{
			Offset:  time.Duration(int64(w)>>errorBits) * time.Microsecond,
			Error:   time.Duration(w&(1<<errorBits-1)) * time.Microsecond,
			At:      base.Add(time.Duration(ns - 1)),
			Wall:    time.Unix(0, wall),
			WallErr: time.Duration(wallErr),
		}, true
	}
}

// ClockOffset returns the last measurement of the peer's clock against
// this node's; ok is false before any exchange.
func (p *Peer) ClockOffset() (s view.ClockSample, ok bool) { return p.offset.get() }

// exchange sends req and measures the peer's clock from the answer.
func (p *Peer) exchange(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	sent, sentMono := p.now(), time.Now()
	err := p.client.DoDeadline(req, resp, deadline)
	if err != nil || resp.StatusCode() != fasthttp.StatusOK && resp.StatusCode() != fasthttp.StatusGatewayTimeout {
		return err // a late batch's answer (late.go) carries the time too
	}
	if peer, perr := strconv.ParseInt(string(resp.Header.Peek(TimeHeader)), 10, 64); perr == nil {
		before := time.Now()
		p.offset.measuredAfter(time.UnixMicro(peer), sent, p.now(), before)
		p.notePeerTime(time.UnixMicro(peer), sentMono)
	}
	return nil
}

// ErrGateway is a ping answered 502 or 504 by something between this node
// and the peer (a proxy, a load balancer) rather than by the peer: the
// peer did not answer it (Answered is false).
var ErrGateway = errors.New("a gateway answered for the peer, which did not")

// FormedHeader is on the answer to an empty batch (a ping): "1" when the
// answering node knows the cluster exists (it has seen every node answer,
// or holds records). A node that starts with an empty data directory asks
// it of its peers to tell a new cluster from one it must copy its share
// from (package rebuild).
const FormedHeader = "X-Dhtkv-Formed"

// RebuildingHeader is on the answer to a ping, "1", while the answering
// node's replica rebuilds after a lost disk and refuses reads: a node
// counting the replicas it can read (its readiness) leaves it out.
const RebuildingHeader = "X-Dhtkv-Rebuilding"

// IncarnationHeader is on the answer to a ping: the answering process's
// Server.Incarnation, in hexadecimal (view.PingAnswer.Incarnation).
const IncarnationHeader = "X-Dhtkv-Incarnation"

// FormedAtHeader is on the answer to a ping once the answering node is
// formed and knows since when: Server.FormedAt in Unix milliseconds
// (view.PingAnswer.FormedAt).
const FormedAtHeader = "X-Dhtkv-Formed-At"

// SettingsHeader is on the answer to a ping: Server.Settings, the
// answering node's settings that every node must share
// (view.PingAnswer.Settings).
const SettingsHeader = "X-Dhtkv-Settings"

// formedAt is what FormedAtHeader says: zero when not known.
func (s *Server) formedAt() time.Time {
	if s.FormedAt == nil {
		return time.Time{}
	}
	return s.FormedAt()
}

// Formed reports what FormedHeader says.
func (s *Server) Formed() (bool, error) {
	if s.ClusterFormed != nil && s.ClusterFormed() {
		return true, nil
	}
	return s.Replica.Store.HasData()
}

// Ping sends an empty batch: it tells whether the peer answers and
// measures its clock, and tells whether the peer knows the cluster
// exists (FormedHeader). The
// coordinator pings every peer periodically, so all are known even while
// no request needs the peer.
func (p *Peer) Ping(epoch uint64, deadline time.Time) (view.PingAnswer, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	p.batchRequest(req, epoch)
	if err := p.exchange(req, resp, deadline); err != nil {
		return view.PingAnswer{}, fmt.Errorf("ping %s: %w", p.url, classify(err))
	}
	if resp.StatusCode() == fasthttp.StatusConflict {
		if p.maps != nil {
			p.maps.Stale(slices.Clone(resp.Body()))
		}
		return view.PingAnswer{}, fmt.Errorf("ping %s: %w", p.url, ErrStaleEpoch)
	}
	if resp.StatusCode() == fasthttp.StatusOK {
		p.checkBehind(resp, epoch)
	}
	if code := resp.StatusCode(); (code == fasthttp.StatusBadGateway || code == fasthttp.StatusGatewayTimeout) && len(resp.Header.Peek(TimeHeader)) == 0 {
		// A proxy's answer for a node behind it that did not answer
		// (dhtkv sends no 502, and its 504, a late batch's, carries
		// its clock): silence, not the node's answer.
		return view.PingAnswer{}, fmt.Errorf("ping %s: %w (status %d: %s)", p.url, ErrGateway, code, firstLine(resp.Body()))
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		// The peer's reason with it: a 403 says "missing or wrong
		// cluster secret", which an operator needs in this node's log.
		return view.PingAnswer{}, fmt.Errorf("ping %s: %w: %s", p.url, errStatus{resp.StatusCode()}, firstLine(resp.Body()))
	}
	inc, _ := strconv.ParseUint(string(resp.Header.Peek(IncarnationHeader)), 16, 64) // absent or malformed: 0, unknown
	a := view.PingAnswer{
		Formed:      string(resp.Header.Peek(FormedHeader)) == "1",
		Rebuilding:  string(resp.Header.Peek(RebuildingHeader)) == "1",
		Incarnation: inc,
		Settings:    string(resp.Header.Peek(SettingsHeader)),
	}
	if ms, err := strconv.ParseInt(string(resp.Header.Peek(FormedAtHeader)), 10, 64); err == nil && ms > 0 {
		a.FormedAt = time.UnixMilli(ms) // absent or malformed: zero, unknown
	}
	return a, nil
}
