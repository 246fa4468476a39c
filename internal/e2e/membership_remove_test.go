package e2e_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A member dies, its disk lost, and no machine replaces it: the operator
// removes it (POST /cluster/remove, dhtkvctl remove), and the cluster
// shrinks without it under a recorded load of ack=2/from=3 writes and
// quorum reads. 4 nodes (3 replicas); node 3 is stopped and its disk
// wiped:
//
//   - "no change under way": the remove begins a decommission of node 3
//     marked dead, whose stages never wait for it;
//   - "the leaving node of a decommission": node 3 drives its own
//     decommission and dies in its stream stage, the gainers' copies
//     from it unfinished (they stall: they copy from every replica of
//     the old set); the remove marks it dead in that change, at the same
//     stage, and the gainers copy from the live replicas.
//
// The change completes; the dead id is gone from every member's map; and
// faultRun.check: no acknowledged write lost and no stale read (the
// history), every key on exactly its replicas under the final map with
// identical records. A write acknowledged at ack=2 reached a live replica
// of the old set, which every gainer copies from. Only make test-faults
// runs it (longFault).
func TestMembershipFaultRemoveDeadMember(t *testing.T) {
	longFault(t) // make test: membership's TestLoggedRemoveDeadMember
	for _, duringDecommission := range casesToRun(t, []bool{false, true}) {
		name := "no change under way"
		if duringDecommission {
			name = "the leaving node of a decommission"
		}
		t.Run(name, func(t *testing.T) { removeDeadMember(t, duringDecommission) })
	}
}

func removeDeadMember(t *testing.T, duringDecommission bool) {
	testcluster.InBubble(t, func(t *testing.T) {
		const victim = 3
		members := []int{0, 1, 2}
		c := startSeeded(t, 4)
		l, rec := newMemLoad(t, c)
		l.setVia(0, 1, 2, victim)
		l.preload(t)
		l.start()
		awaitOps(c, rec, 50)
		logState := func() *maplog.State { return c.Node(0).MapLog().State() }
		var began uint64
		if duringDecommission {
			// Driven by the node itself: the remove takes the change over.
			require.Equal(t, http.StatusAccepted, c.Decommission(victim, victim))
			c.Await(time.Minute, "the decommission's stream stage", func() (bool, string) {
				st := logState()
				ch := st.Map.Change
				if st.Current != nil {
					began = st.Current.Began
				}
				return ch != nil && ch.Stage == clustermap.Stream, st.Map.String()
			})
		}
		l.setVia(members...)
		c.Await(time.Minute, "node 0's replica of the log holds the map", func() (bool, string) {
			return logState().Map != nil, "no map yet" // the log's seed may still be on its way
		})
		id := logState().Map.ByURL(c.URL(victim)).ID
		c.StopNode(victim)
		c.WipeNode(victim)
		if duringDecommission {
			// The bulk keeps the gainers copying for seconds at
			// --move-rate's least, and their copies from the dead node
			// never end: the stage waits for them.
			st := logState()
			require.NotNil(t, st.Map.Change, "the decommission ended before its node died: %s", st.Map)
			require.Equal(t, clustermap.Stream, st.Map.Change.Stage, "%s", st.Map)
		}

		code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/remove?node="+url.QueryEscape(c.URL(victim)), nil)
		require.Equal(t, http.StatusAccepted, code, "remove of a dead member: %s", body)
		removed, err := clustermap.Decode(body)
		require.NoError(t, err)
		require.NotNil(t, removed.Change)
		require.Equal(t, clustermap.Change{Kind: clustermap.Decommission, Node: id, Stage: removed.Change.Stage, Driver: 0, Dead: true}, *removed.Change)
		if duringDecommission {
			require.Equal(t, clustermap.Stream, removed.Change.Stage, "the change stays at its stage")
		} else {
			began = removed.Epoch
		}

		m := c.AwaitStableAfter(removed.Epoch, 2*time.Minute)
		require.Len(t, m.Nodes, 3)
		require.Nil(t, m.Node(id), "the dead id is gone from the map")
		require.Nil(t, m.ByURL(c.URL(victim)))
		last := logState().Last
		require.NotNil(t, last)
		require.Equal(t, maplog.OpRemove, last.Kind, "%+v", last)
		require.Equal(t, began, last.Began, "%+v", last)
		require.False(t, last.Aborted)
		strays(t, c, m, members, "at the change's end")
		awaitOps(c, rec, 200) // load on the final map
		l.end()
		r := &faultRun{t: t, c: c, load: l, members: members}
		r.check(m)
	})
}

// A node cut off from the member asked, and from it alone, is alive:
// remove and replace refuse it, naming a member that reaches it (over the
// real transport: GET /v0/internal/reach on the others). Cut off from
// every member it is dead to all, and removed; healed, it learns so and
// stops.
func TestRemoveRefusesANodeAnotherMemberReaches(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 4, fastLog, func(_ int, cfg *node.Config) { cfg.Replicas = 3 })
		c.AwaitStable(time.Minute)
		const asked, victim = 0, 3
		c.Cut(asked, victim)
		cl := c.Client()
		for _, path := range []string{
			"/cluster/remove?node=" + url.QueryEscape(c.URL(victim)),
			"/cluster/replace?node=" + url.QueryEscape(c.URL(victim)) + "&with=" + url.QueryEscape("http://127.0.0.1:7999"),
		} {
			code, body := cl.Do(t, http.MethodPost, c.AdminURL(asked)+path, nil)
			require.Equal(t, http.StatusConflict, code, "%s: %s", path, body)
			require.Contains(t, string(body), c.URL(victim)+" answers http://127.0.0.1:", path)
			require.Contains(t, string(body), "a cut link, not a dead node", path)
		}
		for _, other := range []int{1, 2} {
			c.Cut(other, victim)
		}
		code, body := cl.Do(t, http.MethodPost, c.AdminURL(asked)+"/cluster/remove?node="+url.QueryEscape(c.URL(victim)), nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		removed, err := clustermap.Decode(body)
		require.NoError(t, err)
		c.Heal() // the live node learns it was removed, and stops
		m := c.AwaitStableAfter(removed.Epoch, time.Minute)
		require.Nil(t, m.ByURL(c.URL(victim)))
	})
}

// Two members die at once, their disks lost, and no machine replaces
// either: the operator removes one (it waits for the other's
// acknowledgement for ever), then the other, which counts it dead in the
// change under way (clustermap.Map.Removing). The first removal finishes
// without either, and the log removes the second after it, under a
// recorded load of ack=2/from=3 writes and quorum reads. 5 nodes (3
// replicas); nodes 2 (a voter of the map's log) and 4 (a non-voter) are
// stopped together and wiped: the log must keep its quorum, which a
// promotion of the dead non-voter in the dead voter's place would lose.
// The checks (faultRun.check): no acknowledged write lost and no stale
// read, every key on exactly its replicas under the final map with
// identical records. A write acknowledged at ack=2 by the two dead nodes
// alone would be lost: the load's writes go to all three replicas, so
// one reached a live one unless it was in flight at the kill.
func TestMembershipFaultRemoveTwoDeadMembers(t *testing.T) {
	longFault(t) // make test: TestMembershipFaultRemoveDeadMember
	testcluster.InBubble(t, func(t *testing.T) {
		members := []int{0, 1, 3}
		c := startSeeded(t, 5)
		l, rec := newMemLoad(t, c)
		l.setVia(members...)
		l.preload(t)
		l.start()
		awaitOps(c, rec, 50)
		logState := func() *maplog.State { return c.Node(0).MapLog().State() }
		c.Await(time.Minute, "node 0's replica of the log holds the map", func() (bool, string) {
			return logState().Map != nil, "no map yet"
		})
		m0 := logState().Map
		first, second := m0.ByURL(c.URL(4)).ID, m0.ByURL(c.URL(2)).ID
		c.StopNode(4)
		c.StopNode(2)
		c.WipeNode(4)
		c.WipeNode(2)

		code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/remove?node="+url.QueryEscape(c.URL(4)), nil)
		require.Equal(t, http.StatusAccepted, code, "remove of the first dead member: %s", body)
		removed, err := clustermap.Decode(body)
		require.NoError(t, err)
		require.Equal(t, clustermap.Change{Kind: clustermap.Decommission, Node: first, Stage: clustermap.WriteBoth, Driver: 0, Dead: true}, *removed.Change)
		c.Await(time.Minute, "the removal waits for the second dead member", func() (bool, string) {
			st := logState()
			w := st.Waiting(-1)
			return st.Map.Epoch == removed.Epoch && len(w) == 1 && w[0] == second, fmt.Sprintf("%s, waiting for %v", st.Map, w)
		})

		code, body = c.Client().Do(t, http.MethodPost, c.AdminURL(1)+"/cluster/remove?node="+url.QueryEscape(c.URL(2)), nil)
		require.Equal(t, http.StatusAccepted, code, "remove of the second dead member: %s", body)
		counted, err := clustermap.Decode(body)
		require.NoError(t, err)
		require.Equal(t, []int{second}, counted.Removing)
		require.Equal(t, *removed.Change, *counted.Change, "the first removal goes on at its stage")

		var m *clustermap.Map
		c.Await(2*time.Minute, "both removed", func() (bool, string) {
			st := logState()
			m = st.Map
			return len(m.Nodes) == 3 && m.Change == nil && len(m.Removing) == 0, m.String()
		})
		m = c.AwaitStableAfter(m.Epoch-1, 2*time.Minute)
		require.Nil(t, m.Node(first))
		require.Nil(t, m.Node(second))
		last := logState().Last
		require.Equal(t, maplog.OpRemove, last.Kind, "%+v", last)
		require.Equal(t, second, last.Node, "%+v", last)
		strays(t, c, m, members, "at the removals' end")
		awaitOps(c, rec, 200) // load on the final map
		l.end()
		r := &faultRun{t: t, c: c, load: l, members: members}
		r.check(m)
	})
}
