package e2e_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/history"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A member of a change dies, its disk lost, once the change reached
// read-new, where abort is refused and the change can only complete: the
// operator replaces it (POST /cluster/replace, dhtkvctl replace) without
// waiting for it, and the change completes with the new machine in its
// place, under a recorded load of ack=2/from=3 writes and quorum reads.
//
// A 3-node cluster (3 replicas) takes a 4th node, j. To hold the change
// at read-new, node 2, once it acknowledged the stream stage and reported
// its copy, is cut from every node but j's connections to it (j still
// compares its gains with node 2): it cannot acknowledge read-new, so
// read-new waits for node 2 alone. There an abort is refused (409), as is
// a replace of a member that answers. Then the victim is stopped and its
// disk wiped:
//
//   - "a node of both sets": node 2 itself;
//   - "the joining node": j, which acknowledged read-new already (node 2
//     is healed once j is replaced).
//
// The new machine's link to node 1 is cut while it starts, so that its
// rebuild cannot end: the change must wait for it at read-new (a machine
// that acknowledged at once would let the change end, and the old set
// drop its copies, while it holds nothing). Once healed, the new machine
// rebuilds its partitions of both sets, acknowledges, and the change
// completes. The checks (faultRun.check): no acknowledged write lost and
// no stale read (the history), every key on exactly its replicas under
// the final map with identical records, every node's map the same.
//
// On a log that refuses a replace under a change (ErrBusy), the replace
// is refused with 409 and the change never completes. Only make
// test-faults runs it (longFault).
func TestMembershipFaultReplaceDeadMemberAtReadNew(t *testing.T) {
	longFault(t) // make test: TestMembershipReplaceDeadNode
	for _, victimIsJoiner := range casesToRun(t, []bool{false, true}) {
		name := "a node of both sets"
		if victimIsJoiner {
			name = "the joining node"
		}
		t.Run(name, func(t *testing.T) { replaceDeadMemberAtReadNew(t, victimIsJoiner) })
	}
}

func replaceDeadMemberAtReadNew(t *testing.T, victimIsJoiner bool) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := startSeeded(t, 3)
		l, rec := newMemLoad(t, c)
		l.setVia(0, 1, 2)
		l.preload(t)
		l.start()
		awaitOps(c, rec, 50)

		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(1, j))
		c.StartNode(j)
		l.setVia(0, 1, 2, j)
		logState := func() *maplog.State { return c.Node(0).MapLog().State() }
		var stream uint64
		c.Await(time.Minute, "node 2's acknowledgement and copy report of the stream stage", func() (bool, string) {
			st := logState()
			ch := st.Map.Change
			if ch == nil || ch.Stage != clustermap.Stream {
				return false, st.Map.String()
			}
			stream = st.Map.Epoch
			return st.Acks[2] >= stream && st.Copied[2] >= stream, fmt.Sprintf("%s, waiting for %v", st.Map, st.Waiting(-1))
		})
		// The bulk keeps j copying for seconds at --move-rate's least.
		l.setVia(0, 1, j)
		for _, k := range []int{0, 1, j} {
			c.Link(2, k).Cut()
			if k != j {
				c.Link(k, 2).Cut()
			}
		}
		c.Await(time.Minute, "read-new, waiting for node 2 alone", func() (bool, string) {
			st := logState()
			ch := st.Map.Change
			return ch != nil && ch.Stage == clustermap.ReadNew && slices.Equal(st.Waiting(-1), []int{2}),
				fmt.Sprintf("%s, waiting for %v", st.Map, st.Waiting(-1))
		})
		code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/abort", nil)
		require.Equal(t, http.StatusConflict, code, "abort in read-new: %s", body)
		spare := c.AddNode(0)
		code, body = c.Client().Do(t, http.MethodPost,
			c.AdminURL(0)+"/cluster/replace?node="+url.QueryEscape(c.URL(1))+"&with="+url.QueryEscape(c.URL(spare)), nil)
		require.Equal(t, http.StatusConflict, code, "replace of a live member during the change: %s", body)
		require.Contains(t, string(body), "answers")

		victim, members := 2, []int{0, 1, j}
		if victimIsJoiner {
			victim, members = j, []int{0, 1, 2}
			l.setVia(0, 1)
		}
		victimURL := c.URL(victim)
		before := logState().Map
		id := before.ByURL(victimURL).ID
		c.StopNode(victim)
		c.WipeNode(victim)

		fresh := c.AddNode(0)
		c.Link(fresh, 1).Cut() // its rebuild cannot end until healed
		code, body = c.Client().Do(t, http.MethodPost,
			c.AdminURL(0)+"/cluster/replace?node="+url.QueryEscape(victimURL)+"&with="+url.QueryEscape(c.URL(fresh)), nil)
		require.Equal(t, http.StatusAccepted, code, "replace of a dead member in read-new: %s", body)
		c.StartNode(fresh)
		if victimIsJoiner {
			for _, k := range []int{0, 1, j} {
				c.Link(2, k).Heal()
				c.Link(k, 2).Heal()
			}
		}

		// The change waits at read-new for the new machine, which holds
		// its acknowledgement while it rebuilds, whatever the others do.
		var replaced uint64
		held := func() (bool, string) {
			st := logState()
			ch := st.Map.Change
			fm, _ := c.Node(fresh).Members().Map()
			why := fmt.Sprintf("log %s, waiting for %v; the new machine at %s, rebuilding %t", st.Map, st.Waiting(-1), fm, c.Node(fresh).Rebuilding())
			return ch != nil && ch.Stage == clustermap.ReadNew && st.Map.Epoch > before.Epoch &&
				st.Map.Node(id).URL == c.URL(fresh) && fm.Epoch == st.Map.Epoch &&
				slices.Equal(st.Waiting(-1), []int{id}) && c.Node(fresh).Rebuilding(), why
		}
		c.Await(time.Minute, "the new machine installed the replace's map, every other member acknowledged it", func() (bool, string) {
			ok, why := held()
			replaced = logState().Map.Epoch
			return ok, why
		})
		// Polled over 3 s of the bubble's clock: fifteen times the
		// service's retry of a held acknowledgement.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			ok, why := held()
			require.True(t, ok, "the change waits for the new machine's rebuild: %s", why)
			require.Equal(t, replaced, logState().Map.Epoch)
		}
		c.Link(fresh, 1).Heal()

		m := c.AwaitStable(2 * time.Minute)
		require.Len(t, m.Nodes, 4)
		require.Equal(t, id, m.ByURL(c.URL(fresh)).ID, "the new machine has the dead member's id")
		require.Nil(t, m.ByURL(victimURL))
		require.False(t, c.Node(fresh).Rebuilding(), "rebuilt before the change ended")
		last := logState().Last
		require.NotNil(t, last)
		require.Equal(t, maplog.OpJoin, last.Kind)
		require.False(t, last.Aborted)
		members = append(members, fresh)
		strays(t, c, m, members, "at the change's end")
		l.setVia(members...)
		awaitOps(c, rec, 200) // load on the final map
		l.end()
		r := &faultRun{t: t, c: c, load: l, members: members}
		r.check(m)
	})
}

// awaitOps waits until the recorder holds n more operations than now.
func awaitOps(c *testcluster.InMemory, rec *history.Recorder, n int) {
	want := len(rec.History().Ops) + n
	c.Await(time.Minute, "load", func() (bool, string) {
		got := len(rec.History().Ops)
		return got >= want, fmt.Sprintf("%d operations of %d", got, want)
	})
}
