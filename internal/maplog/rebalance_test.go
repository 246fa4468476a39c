package maplog

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Rebalance promotes a non-voter only once it has acknowledged a map of
// the log (it runs and follows it): with a voter dead and the group below
// its target, a member that joined but has acknowledged nothing stays a
// non-voter (promoted, it would make a group of which two of four voters
// are down), and the leader promotes it as soon as its acknowledgement
// is in; the dead voter is then demoted, so three vote again.
// (TestDepartedNodeLearnsItIsOut tests the other end: a node the map
// left out is demoted at once and removed after the grace.)
func TestRebalancePromotesOnlyAcknowledgedNonVoters(t *testing.T) {
	g := newGroup(t, 3, fastOptions())
	nd := &testNode{id: 3, dir: t.TempDir(), addr: raft.ServerAddress("node3")}
	g.mu.Lock()
	g.nodes[3] = nd
	g.mu.Unlock()
	g.start(3)
	nd.ack.Store(false) // not a member yet: its acker has acknowledged nothing

	leader := g.leader()
	st := leader.log.State()
	res, err := leader.log.Submit(g.ctx(), Command{Op: OpJoin, Epoch: st.Map.Epoch, From: leader.id, URL: urlOf(3), Addr: string(nd.addr)})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())

	suffrage := func(id int) (raft.ServerSuffrage, bool) {
		conf, err := g.leader().log.Configuration()
		require.NoError(t, err)
		for _, s := range conf {
			if s.ID == ServerID(id) {
				return s.Suffrage, true
			}
		}
		return 0, false
	}
	require.Eventually(t, func() bool {
		s, in := suffrage(3)
		return in && s == raft.Nonvoter
	}, 10*time.Second, 10*time.Millisecond, "the joined node is added as a non-voter")

	victim := 0
	for victim == leader.id {
		victim++
	}
	g.kill(victim)
	require.Eventually(t, func() bool {
		l := g.leader().log
		l.mu.Lock()
		defer l.mu.Unlock()
		_, ok := l.failing[ServerID(victim)]
		return ok
	}, 10*time.Second, 10*time.Millisecond, "the leader's heartbeats to the dead voter fail")
	reg := prometheus.NewRegistry()
	g.leader().log.Register(reg)
	require.Equal(t, 1.0, gauges(t, reg)["dhtkv_maplog_unreachable_peers"], "the leader's gauge counts it")
	// Two healthy voters of three: Rebalance looks for a non-voter to
	// promote, and node 3 has acknowledged nothing.
	l := g.leader().log
	require.Zero(t, l.State().Acks[3])
	require.NoError(t, l.Rebalance())
	s, in := suffrage(3)
	require.True(t, in)
	require.Equal(t, raft.Nonvoter, s, "a node that acknowledged no map is not promoted")

	nd.ack.Store(true)
	require.Eventually(t, func() bool {
		s, _ := suffrage(3)
		return s == raft.Voter
	}, 10*time.Second, 10*time.Millisecond, "promoted once it acknowledged")
	require.Positive(t, g.leader().log.State().Acks[3])
	require.Eventually(t, func() bool {
		conf, err := g.leader().log.Configuration()
		require.NoError(t, err)
		var voters []string
		for _, s := range conf {
			if s.Suffrage == raft.Voter {
				voters = append(voters, string(s.ID))
			}
		}
		s, _ := suffrage(victim)
		return len(voters) == 3 && s != raft.Voter
	}, 10*time.Second, 10*time.Millisecond, "the dead voter demoted: three vote")
}

// votingSteps keeps k healthy voters, a failing voter demoted before a
// candidate is promoted in its place (a candidate that died with it, its
// heartbeats not failed yet, would otherwise make four voters of which
// two are down: no quorum), never the leader, and nothing when there is
// nobody to promote.
func TestVotingSteps(t *testing.T) {
	promote := func(id int) step { return step{promote: true, id: id} }
	demote := func(id int) step { return step{id: id} }
	for _, tc := range []struct {
		name       string
		voters     []int
		candidates []int
		failing    []int
		k, self    int
		want       []step
	}{
		{"settled", []int{0, 1, 2}, []int{3}, nil, 3, 0, nil},
		{"a voter fails: demoted first, then its replacement promoted", []int{0, 1, 2}, []int{3, 4}, []int{2}, 3, 0, []step{demote(2), promote(3)}},
		{"two voters of five fail", []int{0, 1, 2, 3, 4}, []int{5, 6}, []int{1, 3}, 5, 0, []step{demote(1), promote(5), demote(3), promote(6)}},
		{"a failing voter and nobody to promote: kept", []int{0, 1, 2}, nil, []int{2}, 3, 0, nil},
		{"the group grows to its target", []int{0}, []int{1, 2, 3}, nil, 3, 0, []step{promote(1), promote(2)}},
		{"too many vote: the failing one leaves", []int{0, 1, 2, 3, 4}, nil, []int{1}, 3, 0, []step{demote(1), demote(4)}},
		{"too many vote: the highest id leaves, never the leader", []int{0, 1, 2, 3}, nil, nil, 3, 3, []step{demote(2)}},
	} {
		fail := func(id int) bool { return slices.Contains(tc.failing, id) }
		require.Equal(t, tc.want, votingSteps(tc.voters, tc.candidates, fail, tc.k, tc.self), tc.name)
	}
}
