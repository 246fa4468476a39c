package maplog

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Configuration returns the voting group's configuration as committed.
func (l *Log) Configuration() ([]raft.Server, error) {
	f := l.r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("maplog: configuration: %w", err)
	}
	return f.Configuration().Servers, nil
}

// AddVoter makes node id at addr a voter (leader only).
func (l *Log) AddVoter(id int, addr string) error {
	return wrapConf("add voter", id, l.r.AddVoter(ServerID(id), raft.ServerAddress(addr), 0, l.o.ApplyTimeout).Error())
}

// AddNonvoter makes node id at addr a non-voter, or updates its address
// (leader only).
func (l *Log) AddNonvoter(id int, addr string) error {
	return wrapConf("add non-voter", id, l.r.AddNonvoter(ServerID(id), raft.ServerAddress(addr), 0, l.o.ApplyTimeout).Error())
}

// step is one change of a voter's suffrage: promote id, or demote it.
type step struct {
	promote bool
	id      int
}

// votingSteps returns the promotions and demotions, in order, that keep k
// healthy voters: while fewer of voters than k are healthy (failing says
// which are not), the candidate (a reachable non-voter that acknowledged
// a map of the log) with the lowest id is promoted; while more than k
// vote, a failing voter is demoted, else the one with the highest id; the
// leader (self) never.
//
// A failing voter is demoted before a candidate takes its place, not
// after: promoted beside it, a candidate that is dead too (its failed
// heartbeats not seen yet) would make a group of k+1 voters of which two
// are down, which for k = 3 has no quorum, for ever; demoted first, the
// failing voter leaves k-1 voters that answer the leader, a quorum of k
// whatever the promoted candidate turns out to be. In that order one
// unseen death (the candidate's) wedges the group; in this one it takes
// two unlikely things at once: the failing voter alive after all (the
// leader alone cut from it for failAfter) and another voter dead unseen.
// Rebalance counts a voter failing only after failAfter and promotes only
// a non-voter with no failed heartbeat, so that members lost together (a
// rack) are all suspected before any step.
func votingSteps(voters, candidates []int, failing func(int) bool, k, self int) []step {
	voters = slices.Clone(voters)
	var out []step
	healthy := func() int {
		n := 0
		for _, id := range voters {
			if !failing(id) {
				n++
			}
		}
		return n
	}
	demote := func(failingOnly bool) bool {
		victim := -1
		for _, id := range voters {
			if failing(id) && id != self {
				victim = id
				break
			}
		}
		if victim < 0 && !failingOnly {
			for _, id := range slices.Backward(voters) {
				if id != self {
					victim = id
					break
				}
			}
		}
		if victim < 0 {
			return false
		}
		out = append(out, step{id: victim})
		voters = slices.DeleteFunc(voters, func(id int) bool { return id == victim })
		return true
	}
	for _, c := range candidates {
		if healthy() >= k {
			break
		}
		if len(voters) >= k {
			demote(true)
		}
		out = append(out, step{promote: true, id: c})
		voters = append(voters, c)
	}
	for len(voters) > k && demote(false) {
	}
	return out
}

// Demote makes voter id a non-voter (leader only).
func (l *Log) Demote(id int) error {
	return wrapConf("demote", id, l.r.DemoteVoter(ServerID(id), 0, l.o.ApplyTimeout).Error())
}

// Remove takes node id out of the group (leader only). A removed node's
// vote requests are refused by every member (hashicorp/raft refuses a
// candidate not in its configuration), so it cannot disrupt the group.
func (l *Log) Remove(id int) error {
	return wrapConf("remove", id, l.r.RemoveServer(ServerID(id), 0, l.o.ApplyTimeout).Error())
}

// failAfter is how long the leader's heartbeats to a voter fail before
// the voter counts as failing (Rebalance): two heartbeat timeouts, so that
// one failed heartbeat does not demote a live voter, and a non-voter that
// died with it has failed heartbeats of its own by then.
func (l *Log) failAfter() time.Duration { return 2 * l.o.HeartbeatTimeout }

// departGrace is how long a leader keeps replicating to a server the map
// left out before it removes it from the group: ten heartbeats, ample for
// a live follower to receive the entries it lacks; a dead one counts that
// much longer.
func (l *Log) departGrace() time.Duration { return 10 * l.o.HeartbeatTimeout }

func wrapConf(what string, id int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("maplog: %s node %d: %w", what, id, err)
}

// maintain runs the leader's upkeep of the voting group: after every map
// change, leadership change or heartbeat news, and every
// RebalanceInterval.
func (l *Log) maintain() {
	t := time.NewTicker(l.o.RebalanceInterval)
	defer t.Stop()
	for {
		_, changed := l.Watch()
		select {
		case <-l.stop:
			return
		case <-changed:
		case o := <-l.obsCh:
			l.mu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				if _, ok := l.failing[d.PeerID]; !ok {
					l.failing[d.PeerID] = time.Now()
				}
			case raft.ResumedHeartbeatObservation:
				delete(l.failing, d.PeerID)
			case raft.LeaderObservation:
				clear(l.failing) // a new leader's heartbeats tell afresh
			}
			l.mu.Unlock()
		case <-t.C:
		}
		if !l.IsLeader() {
			continue
		}
		if l.Behind() != nil {
			// Its map stopped where its rules did: it must not shape the
			// group by it, nor answer proposals. Another voter leads.
			if err := l.r.LeadershipTransfer().Error(); err != nil {
				l.log.Warn("maplog: hand the office over (this replica is behind the log's rules)", "err", err)
			}
			continue
		}
		if err := l.Rebalance(); err != nil && !errors.Is(err, raft.ErrNotLeader) {
			l.log.Warn("maplog: rebalance the voting group", "err", err)
		}
	}
}

// Rebalance makes the group's configuration follow the map (leader only):
// a node that left the map leaves the group, a member with a log address
// joins it as a non-voter, and the voters are kept at voterCount, healthy
// ones replacing those the leader's heartbeats fail to reach
// (votingSteps). A leader that left the map hands its office to another
// voter first.
func (l *Log) Rebalance() error {
	st := l.State()
	if st.Map == nil {
		return nil
	}
	servers, err := l.Configuration()
	if err != nil {
		return err
	}
	l.mu.Lock()
	suspect := maps.Clone(l.failing)
	l.mu.Unlock()
	now := time.Now()
	// A voter counts as failing once the leader's heartbeats have failed
	// for failAfter; a non-voter is a candidate only while none fails.
	// So two members that die together are both suspected before either
	// step is taken: the voter is not replaced by the other dead one.
	failing := func(id int) bool {
		since, ok := suspect[ServerID(id)]
		return ok && now.Sub(since) >= l.failAfter()
	}
	inConf := map[int]raft.Server{}
	departing := map[raft.ServerID]bool{}
	for _, s := range servers {
		id, ok := nodeOf(s.ID)
		if !ok || st.Map.Node(id) == nil {
			if s.ID == ServerID(l.self) {
				return l.r.LeadershipTransfer().Error()
			}
			// A node the map left out (a decommission's last map) learns
			// it from its replica of the log: removed at once, it may not
			// have received that entry yet (a commit needs a quorum, not
			// every member), and it would never learn it is out. So the
			// leader keeps replicating to it for departGrace first, as a
			// non-voter: its vote must not count (it stops once it
			// learns, and a quorum of a group with a stopped voter in it
			// is one failure closer to lost).
			departing[s.ID] = true
			if s.Suffrage == raft.Voter {
				if err := l.r.DemoteVoter(s.ID, 0, l.o.ApplyTimeout).Error(); err != nil {
					return fmt.Errorf("maplog: demote %s, not in the map: %w", s.ID, err)
				}
			}
			l.mu.Lock()
			since, seen := l.departed[s.ID]
			if !seen {
				l.departed[s.ID], since = now, now
			}
			l.mu.Unlock()
			if now.Sub(since) < l.departGrace() {
				continue
			}
			if err := l.r.RemoveServer(s.ID, 0, l.o.ApplyTimeout).Error(); err != nil {
				return fmt.Errorf("maplog: remove %s, not in the map: %w", s.ID, err)
			}
			continue
		}
		inConf[id] = s
	}
	l.mu.Lock()
	for id := range l.departed {
		if !departing[id] {
			delete(l.departed, id)
		}
	}
	l.mu.Unlock()
	for _, n := range st.Map.Nodes {
		addr := st.Addrs[n.ID]
		if addr == "" && l.o.AddrFromURL {
			addr = URLAddr(n.URL)
		}
		if addr == "" {
			continue
		}
		if s, ok := inConf[n.ID]; ok && string(s.Address) == addr {
			continue
		}
		if s, ok := inConf[n.ID]; ok && s.Suffrage == raft.Voter {
			// A replaced node's new address: keep its vote.
			if err := l.AddVoter(n.ID, addr); err != nil {
				return err
			}
		} else if err := l.AddNonvoter(n.ID, addr); err != nil {
			return err
		}
		inConf[n.ID] = raft.Server{ID: ServerID(n.ID), Address: raft.ServerAddress(addr), Suffrage: inConf[n.ID].Suffrage}
	}
	var voters, candidates []int
	for _, id := range sortedIDs(inConf) {
		s := inConf[id]
		switch {
		case s.Suffrage == raft.Voter:
			voters = append(voters, id)
		case suspect[s.ID].IsZero() && st.Acks[id] > 0:
			// A non-voter is promoted only once it has acknowledged a map
			// of the log (it runs and follows it): a leader just elected
			// has no heartbeat failures on record yet, and promoting a
			// joined node not started would make four voters of which
			// two are down, a group without a quorum while a voter is
			// dead (TestMembershipLeaderKilledMidChangeResumes).
			candidates = append(candidates, id)
		}
	}
	for _, st := range votingSteps(voters, candidates, failing, voterCount(l.o.Voters, len(inConf)), l.self) {
		var err error
		if st.promote {
			err = l.AddVoter(st.id, string(inConf[st.id].Address))
		} else {
			err = l.Demote(st.id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
