package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/view"
)

// ErrNotEnoughReplicas is returned when fewer than ack replicas answered
// before the deadline (or success became impossible); the error is a
// *ReplicasError that says which.
var ErrNotEnoughReplicas = errors.New("not enough replicas")

// ReplicasError is ErrNotEnoughReplicas with its account: how many
// replicas were asked and answered, how many were needed, and each one
// that failed, with why.
type ReplicasError struct {
	Answered, Need, Asked int
	// BothSets: a membership change was under way, and Need was needed
	// of the old replica set and NewNeed of the new.
	BothSets bool
	NewNeed  int
	Failed   []ReplicaFailure
}

// ReplicaFailure is one replica's failure in a request.
type ReplicaFailure struct {
	Node   string
	Reason string // "timeout", "silent" (failed unsent: rpc.ErrSilent), "refused", or the error
}

func (e *ReplicasError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "not enough replicas: %d of %d answered, %d needed", e.Answered, e.Asked, e.Need)
	if e.BothSets {
		fmt.Fprintf(&b, " of the old replica set and %d of the new (a membership change is under way)", e.NewNeed)
	}
	for i, f := range e.Failed {
		if i == 0 {
			b.WriteString("; failed: ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", f.Node, f.Reason)
	}
	return b.String()
}

func (e *ReplicasError) Is(target error) bool { return target == ErrNotEnoughReplicas }

// failureReason is a replica call's error in a word or a line.
func failureReason(err error) string {
	switch {
	case errors.Is(err, rpc.ErrSilent):
		return "silent"
	case errors.Is(err, rpc.ErrTimeout):
		return "timeout"
	case rpc.IsRefused(err):
		return "refused: " + err.Error()
	}
	return err.Error()
}

// fanOut calls the replicas of old and new (the second set only while a
// membership change is under way; nil otherwise) and feeds successful
// answers to merge (on the calling goroutine, so merge needs no lock)
// until ack answered in old and newAck in new (each, or all of a smaller
// set), or that became impossible. A replica in both sets is called once
// and counts in both. It returns the number of successes.
//
// Writes start every replica at once (initial = all). Reads start only
// `initial` = ack of them, the local replica first (it costs no network),
// and start a spare as soon as one fails, and all the spares once
// hedgeDelay has passed without ack answers. Every remote call costs a
// client and a server request, so this halves the work of a GET
// ack=2/from=3 without changing its answers or its failure semantics: a
// dead replica still fails over at once, a slow one after hedgeDelay.
// hedgeDelay 0 starts everything at once, like a write.
//
// Remote calls are started, not waited for: remote(n, call) starts call
// to node n (view.Go; call's Key, Deadline, Tag and Done are set), and
// the call comes back on one channel of the request's, where finishCall
// turns it into an answer, by op. No goroutine runs per call: a request
// that needs one remote replica wakes its own goroutine once, when the
// answer is in. Calls still out when fanOut returns (stragglers) are
// received and finished by one goroutine of the request's, so that what
// finishCall does (a write's hint for a replica that failed, the latency
// metrics) happens for every call; Close waits for it.
//
// Memory. The request's key is copied once, into its fan; the fan, its
// timer and its calls are reused by later requests once every call has
// come back. local, remote and merge run on the calling goroutine only,
// and what finishes a call is data (op), not a closure, so that a
// request that leaves no call behind allocates nothing here.
func (c *Coordinator) fanOut(
	r *routes, deadline time.Time, key []byte, old, new []int, ack, newAck, initial int,
	op fanOp,
	local func(key []byte) answer,
	remote func(node int, call *view.Call),
	merge func(answer),
) (int, error) {
	if op.kind == 0 {
		panic("cluster: fanOut without an op kind") // a caller's bug, not a request's
	}
	var repBuf [2 * maxReplicas]int
	reps := append(repBuf[:0], old...)
	for _, n := range new {
		if !slices.Contains(old, n) {
			reps = append(reps, n)
		}
	}
	if c.hedgeDelay == 0 {
		initial = len(reps)
	}
	for i, n := range reps { // the local replica first
		if n == r.Self {
			copy(reps[1:i+1], reps[:i])
			reps[0] = n
			break
		}
	}
	// The sets' counts: a success or failure of node n counts in each set
	// that has it.
	var ok, failed [2]int
	sets := [2][]int{old, new}
	count := func(n int, into *[2]int) {
		for s, set := range sets {
			if slices.Contains(set, n) {
				into[s]++
			}
		}
	}
	// The old set must give ack replicas and the new newAck, each or all
	// it has: during a replicas change one set may be smaller than ack
	// (placement.Sets.Replicas).
	need := [2]int{min(ack, len(old)), min(newAck, len(new))}
	done := func() bool { return ok[0] >= need[0] && (new == nil || ok[1] >= need[1]) }
	hopeless := func() bool {
		return failed[0] > len(old)-need[0] || (new != nil && failed[1] > len(new)-need[1])
	}
	now := time.Now()
	f := c.newFan(len(reps))
	f.r, f.op = r, op
	f.key = append(f.key[:0], key...) // the calls outlive the handler's buffer
	k := f.key
	next, runLocal, out := 0, false, 0
	launch := func(count int) {
		for ; count > 0 && next < len(reps); count-- {
			n := reps[next]
			next++
			if n == r.Self {
				runLocal = true
				continue
			}
			c.inflight.Add(1)
			c.m.inFlight.Inc()
			call := &f.calls[out]
			*call = view.Call{Key: k, Deadline: deadline, Tag: out, Done: f.results}
			f.nodes[out], f.sent[out] = n, time.Now()
			out++
			remote(n, call)
		}
	}
	launch(initial)

	succeeded, answered, received := 0, 0, 0
	var firstErr error
	var failures []ReplicaFailure // only built when a call fails
	timedOut := false
	heard := make([]bool, 0, 8) // by position in reps, of the calls answered
	take := func(a answer) {
		answered++
		for i, n := range reps {
			if n == a.node {
				for len(heard) <= i {
					heard = append(heard, false)
				}
				heard[i] = true
			}
		}
		if a.err != nil {
			count(a.node, &failed)
			if firstErr == nil {
				firstErr = a.err
			}
			failures = append(failures, ReplicaFailure{Node: r.URL(a.node), Reason: failureReason(a.err)})
			launch(1) // replace it with a spare, if any is left
			return
		}
		succeeded++
		count(a.node, &ok)
		if merge != nil {
			merge(a)
		}
	}
	if runLocal {
		a := local(k)
		a.node = r.Self
		take(a)
	}
	// One timer: first the hedge delay (reads with spares left), then just
	// after the request's deadline. Every call ends by the deadline on its
	// own (and is then counted as an answer, not a straggler); the wait has
	// a bound of its own too, so no call can hold the answer much past it.
	if !done() && !hopeless() {
		hedging := next < len(reps)
		grace := min(c.timeout/10, 50*time.Millisecond)
		wait := deadline.Sub(now) + grace
		if hedging {
			wait = min(wait, c.readHedgeDelayOf(r, now))
		}
		f.timer.Reset(wait)
	wait:
		for !done() && !hopeless() {
			select {
			case call := <-f.results:
				received++
				take(c.receive(f, call))
			case <-f.timer.C:
				if !hedging {
					if firstErr == nil {
						firstErr = fmt.Errorf("%w: no answer by the deadline", rpc.ErrTimeout)
					}
					timedOut = true
					break wait
				}
				hedging = false
				if next < len(reps) {
					c.m.hedgedReads.Inc()
				}
				launch(len(reps))
				f.timer.Reset(time.Until(deadline) + grace)
			}
		}
		// Stopped before the fan can be recycled, so that this stop
		// cannot undo a later request's Reset, and with no tick left
		// for that request to read (none is, with Go 1.23's timers; the
		// drain covers GODEBUG=asynctimerchan=1).
		if !f.timer.Stop() {
			select {
			case <-f.timer.C:
			default:
			}
		}
	}
	if next > answered {
		c.m.stragglers.Add(float64(next - answered))
	}
	c.finishLater(f, out-received)
	if !done() {
		pending := "no answer yet when ack was out of reach"
		if timedOut {
			pending = "no answer by the deadline"
		}
		for i, n := range reps[:next] { // asked, not heard from
			if i >= len(heard) || !heard[i] {
				failures = append(failures, ReplicaFailure{Node: r.URL(n), Reason: pending})
			}
		}
		c.log.Debug("replicas failed", "ok", succeeded, "need", ack, "err", firstErr)
		return succeeded, &ReplicasError{Answered: succeeded, Need: need[0], Asked: next, BothSets: new != nil, NewNeed: need[1], Failed: failures}
	}
	return succeeded, nil
}

// fanOp is the kind of a fan-out's replica calls, which says what
// finishing one does beside making it an answer (finishCall).
type fanOp struct {
	kind opKind
	env  []byte // opWrite: the encoded record, for the hint of a replica that missed it
}

type opKind uint8

const (
	// opRead: a GET's read; an answer's latency feeds the hedge delay,
	// and its version is observed by this node's clock. (The zero kind
	// is none: fanOut refuses it.)
	opRead opKind = iota + 1
	// opWrite: a client's write; a replica that failed it gets a hint.
	opWrite
	// opRepair: a read repair's write; nothing more.
	opRepair
)

// finishCall turns call, which came back from node n after starting at
// sent, into an answer, and does what op asks of it. It may run after
// fanOut has returned (a straggler): it reads only the fan and the call.
func (c *Coordinator) finishCall(f *fan, n int, call *view.Call, sent time.Time) answer {
	p := f.r.peers[n]
	switch f.op.kind {
	case opRead:
		p.reads.observe(sent, call.Ended, call.Err)
		if call.Err == nil {
			p.readLat.record(call.Ended.Sub(sent), call.Ended)
		}
		if call.Found {
			// Keeps clocks close; nothing is stored here, so a version
			// beyond the bound (refused, not observed) or a failure to
			// persist the clock's bound only costs that. A read
			// repair then stores it by ApplyRemote's rules, or fails.
			_ = c.local.Observe(call.Rec.Version)
		}
		return answer{rec: call.Rec, found: call.Found, err: call.Err}
	case opWrite:
		p.writes.observe(sent, call.Ended, call.Err)
		if err := call.Err; err != nil && (!rpc.IsRefused(err) || errors.Is(err, rpc.ErrAhead)) && !errors.Is(err, rpc.ErrStaleEpoch) && c.d.Hints != nil {
			// The key is the fan's, reused once the fan is; the
			// envelope is this write's own.
			c.d.Hints.Add(n, bytes.Clone(call.Key), f.op.env)
		}
		return answer{rec: record.Record{Version: call.Newer}, err: call.Err}
	}
	return answer{err: call.Err} // opRepair
}

// receive finishes a call of f that came back.
func (c *Coordinator) receive(f *fan, call *view.Call) answer {
	n := f.nodes[call.Tag]
	a := c.finishCall(f, n, call, f.sent[call.Tag])
	a.node = n
	c.m.inFlight.Dec()
	c.inflight.Done()
	return a
}

// fan is one request's remote calls, and the channel they come back on:
// pooled, since every request with a remote replica needs one, and
// returned once every call it started has come back.
type fan struct {
	calls   []view.Call
	nodes   []int           // each call's replica
	sent    []time.Time     // when each call started, for its latency
	results chan *view.Call // room for every call: a peer never blocks on it
	timer   *time.Timer     // fanOut's one timer; stopped whenever the fan is not in fanOut
	key     []byte          // the request's key: every call's Key
	r       *routes         // the routes the calls went by, and op: for finishCall
	op      fanOp
}

// maxPooledKey is the largest key buffer a recycled fan keeps.
const maxPooledKey = 1 << 10

// pooledFan is the size of the fans kept for reuse: a larger fan out (a
// replication factor above maxReplicas) gets a fan of its own.
const pooledFan = 2 * maxReplicas

func (c *Coordinator) newFan(n int) *fan {
	if n <= pooledFan {
		if f, ok := c.fans.Get().(*fan); ok {
			return f
		}
		n = pooledFan
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &fan{calls: make([]view.Call, n), nodes: make([]int, n), sent: make([]time.Time, n), results: make(chan *view.Call, n), timer: timer}
}

// finishLater receives and finishes the pending calls of f that fanOut
// did not wait for, on a goroutine of their own, and then recycles f;
// with none pending it recycles f at once.
func (c *Coordinator) finishLater(f *fan, pending int) {
	if pending == 0 {
		c.recycle(f)
		return
	}
	c.inflight.Add(1)
	go c.drain(f, pending)
}

func (c *Coordinator) drain(f *fan, pending int) {
	defer c.inflight.Done()
	for range pending {
		c.receive(f, <-f.results)
	}
	c.recycle(f)
}

// recycle keeps f for a later request, without references to this one's
// memory, once every call it started has come back.
func (c *Coordinator) recycle(f *fan) {
	if len(f.calls) != pooledFan {
		return
	}
	clear(f.calls)
	f.r, f.op = nil, fanOp{}
	if cap(f.key) > maxPooledKey {
		f.key = nil
	}
	c.fans.Put(f)
}
