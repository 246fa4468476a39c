package rpc

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// DeadlineHeader carries, on a batch, the time after which its sender no
// longer waits for the answer: the earliest deadline of its calls, on the
// receiving node's clock as the sender last measured it (the offset read
// off TimeHeader, plus that measurement's error), in Unix microseconds.
// A sender that has not measured the receiver's clock in the last
// minute sends none.
//
// Why: a node that was paused (a stopped process, a frozen VM, a long
// stall) finds, when it runs again, every batch its peers sent meanwhile
// in its sockets, each long given up by its sender, whose writes went to
// hints or failed. Applying them all at once cost a 3-node cluster on two
// cores a second or more of every request (docs/benchmarks.md section
// 49): the paused node read 243 MB of such batches from 4,000
// connections and took the cores to apply them. Cassandra drops such
// messages the same way (cross_node_timeout: a replica discards a
// mutation whose coordinator has already timed out).
const DeadlineHeader = "X-Dhtkv-Deadline"

// lateGrace is how long after its DeadlineHeader a batch is still
// served: the clock offset it was converted with may have drifted since
// it was measured (up to a minute before), and a batch refused a little
// late costs nothing, one applied a second late nothing more than it did
// before.
const lateGrace = time.Second

// setDeadline sets DeadlineHeader on req for a batch whose sender waits
// until deadline (time.Now's clock), if the peer's clock was measured in
// the last minute.
func (p *Peer) setDeadline(req *fasthttp.Request, deadline time.Time) {
	s, ok := p.offset.get()
	if !ok || time.Since(s.At) > time.Minute {
		return
	}
	at := p.now().Add(time.Until(deadline) + s.Offset + s.Error)
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
