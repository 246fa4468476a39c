package maplog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// Propose applies c if this replica leads and returns its result: the
// real outcome, accepted or refused with the reason. On another replica
// it returns a *NotLeaderError naming the leader.
func (l *Log) Propose(ctx context.Context, c Command) (*Result, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
	}
	return l.propose(ctx, b)
}

func (l *Log) propose(ctx context.Context, b []byte) (*Result, error) {
	if len(b) > l.o.MaxCommandBytes {
		return nil, fmt.Errorf("maplog: command of %d bytes over the limit of %d", len(b), l.o.MaxCommandBytes)
	}
	l.propMu.Lock()
	if l.closing {
		l.propMu.Unlock()
		return nil, ErrClosed
	}
	l.proposing.Add(1)
	l.propMu.Unlock()
	defer l.proposing.Done()
	if l.r.State() != raft.Leader {
		return nil, l.notLeader()
	}
	timeout := l.o.ApplyTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	f := l.r.Apply(b, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return nil, l.notLeader()
		}
		return nil, fmt.Errorf("maplog: propose: %w", err)
	}
	res, ok := f.Response().(*Result)
	if !ok {
		return nil, fmt.Errorf("maplog: propose: unexpected response %T", f.Response())
	}
	if err := l.fsm.behindErr(); err != nil {
		// This replica refuses what it can no longer apply (fsm.checkRules)
		// while the others apply it: its answer is not the log's. The
		// outcome stays uncertain; a request sent again with its ID gets
		// the first's from a leader that applies the rules.
		return nil, fmt.Errorf("maplog: propose: %w", err)
	}
	return res, nil
}

func (l *Log) notLeader() error {
	id, addr := l.Leader()
	return &NotLeaderError{LeaderID: id, LeaderAddr: addr}
}

// answerForwarded answers a proposal forwarded by another member.
func (l *Log) answerForwarded(ctx context.Context, b []byte) []byte {
	var c Command
	var rep forwardReply
	if err := json.Unmarshal(b, &c); err != nil {
		rep.Err = fmt.Sprintf("bad command: %v", err)
		out, _ := json.Marshal(rep)
		return out
	}
	relay := c.Relay
	if relay {
		c.Relay = false
		b, _ = json.Marshal(c) // decoded from JSON: encodes
	}
	res, err := l.propose(ctx, b)
	var nl *NotLeaderError
	switch {
	case err == nil:
		rep.Result = res
	case relay && errors.As(err, &nl) && nl.LeaderAddr != "" && l.fwd != nil:
		// One hop only: the command forwarded no longer asks for a relay.
		out, ferr := l.fwd.Forward(ctx, nl.LeaderAddr, b)
		if ferr == nil {
			return out
		}
		rep.Leader, rep.Err = nl.LeaderAddr, fmt.Sprintf("relay to the leader: %v", ferr)
	default:
		if errors.As(err, &nl) {
			rep.Leader = nl.LeaderAddr
		}
		rep.Err = err.Error()
	}
	out, _ := json.Marshal(rep)
	return out
}

// SetPeers tells the log the members of m, the map the node installed:
// Submit goes through them when this replica's configuration does not
// name them. A node added to the group while cut off from the leader has
// no configuration yet and knows no leader: the map it installed (a
// member gave it) is then its only route to the log. A member's address
// is its URL's host:port (Options.AddrFromURL) or the one it registered
// in the log; a member with neither is left out.
func (l *Log) SetPeers(m *clustermap.Map) {
	if m == nil {
		return
	}
	addrs := l.State().Addrs
	peers := make([]Server, 0, len(m.Nodes))
	for _, n := range m.Nodes {
		addr := addrs[n.ID]
		if addr == "" && l.o.AddrFromURL {
			addr = URLAddr(n.URL)
		}
		if addr != "" {
			peers = append(peers, Server{ID: n.ID, Addr: addr})
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = peers
}

// nextRelay is the address of the member after the one at prev (by
// address; the first when prev is ""), of the group's configuration and
// the peers set (SetPeers), skipping this node and the leader; "" when
// there is none, and after the last: a caller that went through every
// member goes to the leader directly again.
func (l *Log) nextRelay(prev string, leader int) string {
	servers, err := l.Configuration()
	if err != nil {
		servers = nil
	}
	var addrs []string
	add := func(id int, addr string) {
		if id != l.self && id != leader && addr != "" && !slices.Contains(addrs, addr) {
			addrs = append(addrs, addr)
		}
	}
	for _, s := range servers {
		if id, ok := nodeOf(s.ID); ok {
			add(id, string(s.Address))
		}
	}
	l.mu.Lock()
	for _, p := range l.peers {
		add(p.ID, p.Addr)
	}
	l.mu.Unlock()
	slices.Sort(addrs)
	for _, a := range addrs {
		if prev == "" || a > prev {
			return a
		}
	}
	return ""
}

// isChange reports whether op changes the map (and so gets an ID).
func isChange(op Op) bool {
	switch op {
	case OpJoin, OpDecommission, OpRemove, OpReplace, OpAbort, OpReplicas, OpSeed:
		return true
	}
	return false
}

// encode is c as the log carries it. A change is given an ID first, so
// that a retry after an uncertain outcome is answered with the first
// attempt's outcome.
func (l *Log) encode(c Command) ([]byte, error) {
	if c.ID == "" && isChange(c.Op) {
		c.ID = requestID()
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
	}
	if len(b) > l.o.MaxCommandBytes {
		return nil, fmt.Errorf("maplog: %s of %d bytes over the limit of %d", c.Op, len(b), l.o.MaxCommandBytes)
	}
	return b, nil
}

// Submit proposes c until the log answers or ctx ends: on a replica that
// does not lead it forwards c to the leader (with a Network), and it
// tries again while there is no leader or the leader loses its office.
// A change is given an ID first, so that a retry after an uncertain
// outcome is answered with the first attempt's outcome.
func (l *Log) Submit(ctx context.Context, c Command) (*Result, error) {
	if c.ID == "" && isChange(c.Op) {
		c.ID = requestID() // here, not in encode alone: the relayed copy (rc) is the same request
	}
	b, err := l.encode(c)
	if err != nil {
		return nil, err
	}
	wait := max(l.o.HeartbeatTimeout/10, 10*time.Millisecond)
	var relay string   // a member relaying to the leader, "" while it is reached directly
	var relayed []byte // c asking to be relayed
	for {
		res, err := l.propose(ctx, b)
		if err == nil {
			return res, nil
		}
		var nl *NotLeaderError
		switch {
		case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, ErrBehindRules):
			return nil, err // this replica will not answer again
		case errors.As(err, &nl) && l.fwd != nil:
			if nl.LeaderAddr == "" && relay == "" {
				// No leader known here: perhaps only this member lost
				// it (cut from the leader alone). Ask another member.
				relay = l.nextRelay("", nl.LeaderID)
			}
			if relay != "" && relayed == nil {
				rc := c
				rc.Relay = true
				if relayed, err = json.Marshal(rc); err != nil {
					return nil, fmt.Errorf("maplog: encode %s: %w", c.Op, err)
				}
			}
			to, fb := nl.LeaderAddr, b
			if relay != "" {
				to, fb = relay, relayed
			}
			if to == "" {
				break
			}
			out, ferr := l.fwd.Forward(ctx, to, fb)
			var rep forwardReply
			if ferr == nil {
				ferr = json.Unmarshal(out, &rep)
			}
			switch {
			case rep.Result != nil && ferr == nil:
				return rep.Result, nil
			case ferr != nil:
				err = ferr
			default:
				err = errors.New(rep.Err)
			}
			// The leader or the relay is out of reach, or the relay
			// could not reach its leader: go through the next member of
			// the group (it forwards to its leader), and once every
			// member was tried, to the leader directly again. A relay
			// must not be the only route: the member it names may be
			// the one cut off, while the leader is in reach (a member
			// that asked before the election ended, when it knew no
			// leader, and then learned of one).
			relay = l.nextRelay(relay, nl.LeaderID)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: %s not answered: %w (last: %w)", c.Op, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// SubmitVia proposes c through the log at addr, a member's log address:
// the route of a node outside the voting group's configuration (a node
// being joined, registering its address with OpAddr, or one whose
// replica knows no leader yet), which cannot learn the leader from its
// own replica. A member that does not lead answers with the leader's
// address, which the next try goes to; it tries again until the log
// answers or ctx ends. It needs a Forwarder (a Network).
func (l *Log) SubmitVia(ctx context.Context, addr string, c Command) (*Result, error) {
	if l.fwd == nil {
		return nil, errors.New("maplog: no network to reach another member's log")
	}
	b, err := l.encode(c)
	if err != nil {
		return nil, err
	}
	wait := max(l.o.HeartbeatTimeout/10, 10*time.Millisecond)
	to := addr
	for {
		out, err := l.fwd.Forward(ctx, to, b)
		var rep forwardReply
		if err == nil {
			err = json.Unmarshal(out, &rep)
		}
		switch {
		case err != nil:
			to = addr // the leader named may be gone: ask the member again
		case rep.Result != nil:
			return rep.Result, nil
		case rep.Leader != "":
			to, err = rep.Leader, errors.New(rep.Err)
		default:
			to, err = addr, errors.New(rep.Err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: %s through %s not answered: %w (last: %w)", c.Op, addr, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// requestID is a new change's Command.ID: 96 random bits.
func requestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Ack reports that this node installed the map of epoch.
func (l *Log) Ack(ctx context.Context, epoch uint64) (*Result, error) {
	return l.Submit(ctx, Command{Op: OpAck, Node: l.self, Epoch: epoch, Rules: l.fsm.rules})
}

// Copied reports that this node copied its gains at the stream epoch.
func (l *Log) Copied(ctx context.Context, epoch uint64) (*Result, error) {
	return l.Submit(ctx, Command{Op: OpCopied, Node: l.self, Epoch: epoch})
}

// AwaitOutcome waits until the change the request id began has ended
// (completed or aborted), as this replica applies the log.
func (l *Log) AwaitOutcome(ctx context.Context, id string) (*Outcome, error) {
	for {
		s, changed := l.Watch()
		if s.Last != nil && s.Last.ID == id {
			o := *s.Last
			return &o, nil
		}
		// Ended, and another change after it, between two looks.
		for _, o := range s.Recent {
			if o.ID == id {
				return &o, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("maplog: change %s not ended: %w", id, ctx.Err())
		case <-changed:
		}
	}
}
