package rpc

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// DeadlineHeader carries, on a batch, the time after which its sender no
// longer waits for the answer: the earliest deadline of its calls, on the
// receiving node's clock, in Unix microseconds. The sender reckons the
// receiver's clock from the last answer that carried it (TimeHeader),
// forward on its own monotonic clock, so that a step of the sender's
// wall clock changes nothing; it adds that reading's error and a
// thousandth of its age for drift. A sender that has read no answer of
// the receiver's yet sends none; nor do pings (empty batches) nor
// in-process peers (Direct).
//
// Why: a node that was paused (a stopped process, a frozen VM, a long
// stall) finds, when it runs again, every batch its peers sent meanwhile
// in its sockets, each long given up by its sender, whose writes went to
// hints or failed. Applying them all at once cost a 3-node cluster on two
// cores one to six seconds of every request (docs/benchmarks.md section
// 49): the paused node read 200-243 MB of such batches from 4,000
// connections and took the cores to apply them. Cassandra drops such
// messages the same way (cross_node_timeout: a replica discards a
// mutation whose coordinator has already timed out).
//
// Only a step of the receiver's clock since the sender read it makes a
// timely batch look late. Its 504 then carries the receiver's time, and
// a sender still waiting sends each of its calls once more (sendOnce),
// with the deadline reckoned from the new reading.
const DeadlineHeader = "X-Dhtkv-Deadline"

// lateGrace is how long after its DeadlineHeader a batch is still
// served: a batch refused a little late costs nothing, one applied a
// second late no more than it did before.
const lateGrace = time.Second

// peerTime is the peer's clock read off an answer: peer is its reading,
// moved to when the answer arrived (half the round trip added), at is
// that moment on this process's monotonic clock, and err is half the
// round trip.
type peerTime struct {
	peer time.Time
	at   time.Time
	err  time.Duration
}

// notePeerTime records the peer's clock, peer, read off an answer to an
// exchange begun at sent (time.Now, with its monotonic reading).
func (p *Peer) notePeerTime(peer, sent time.Time) {
	now := time.Now()
	rtt := now.Sub(sent) // monotonic
	if rtt < 0 || rtt > 2*time.Second {
		return // too slow to tell, as clockOffset.measured
	}
	p.peerTimeMu.Lock()
	p.peerTime = peerTime{peer: peer.Add(rtt / 2), at: now, err: rtt / 2}
	p.peerTimeMu.Unlock()
}

// lastPeerTime is the peer's clock as last read; ok is false before any
// answer was read.
func (p *Peer) lastPeerTime() (t peerTime, ok bool) {
	p.peerTimeMu.Lock()
	t = p.peerTime
	p.peerTimeMu.Unlock()
	return t, !t.at.IsZero()
}

// setDeadline sets DeadlineHeader on req for a batch whose sender waits
// until deadline (time.Now's clock), once an answer of the peer's was
// read.
func (p *Peer) setDeadline(req *fasthttp.Request, deadline time.Time) {
	t, ok := p.lastPeerTime()
	if !ok {
		return
	}
	age := time.Since(t.at)
	at := t.peer.Add(age + time.Until(deadline) + t.err + age/1000)
	var num [20]byte
	req.Header.SetBytesV(DeadlineHeader, strconv.AppendInt(num[:0], at.UnixMicro(), 10))
}

// late reports whether a batch whose DeadlineHeader is h (empty: none)
// arrived more than lateGrace after its sender stopped waiting, by this
// node's clock.
func (s *Server) late(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	us, err := strconv.ParseInt(string(h), 10, 64)
	if err != nil {
		return false // a malformed header is not a reason to refuse the batch
	}
	return s.Replica.Clock.Wall().After(time.UnixMicro(us).Add(lateGrace))
}
