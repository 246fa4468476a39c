package membership_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// requireLiveSources checks that the node at u copied every partition it
// gains in each change (a map of its first stage) from, or compared it
// with, every replica of the old set but the dead ones, and never a dead
// one.
func (c *cluster) requireLiveSources(u string, changes []*clustermap.Map, dead ...int) {
	t := c.t
	want := map[partition.ID][]int{}
	for _, change := range changes {
		id := change.ByURL(u).ID
		for r, ps := range placement.Of(change).Gains(id) {
			for _, p := range ps {
				if !slices.Contains(dead, r) {
					want[p] = append(want[p], r)
				}
			}
		}
	}
	c.mu.Lock()
	covered := c.covered[u]
	c.mu.Unlock()
	require.Len(t, covered, len(want), "%s copied every partition it gains", u)
	for p, rs := range want {
		got := slices.Sorted(slices.Values(covered[p]))
		for _, d := range dead {
			require.NotContains(t, got, d, "%s: partition %d copied from dead node %d", u, p, d)
		}
		require.Subset(t, got, rs, "%s: partition %d from every live replica of the old set", u, p)
	}
}

// A dead member removed through the log (dhtkvctl remove): refused while
// it answers, and for this node itself; once it is dead, a decommission
// whose stages wait for every member but it, whose gainers copy from the
// live replicas of the old set only, and at whose end it is out of every
// member's map.
func TestLoggedRemoveDeadMember(t *testing.T) {
	c, urls, logs, l := fourSettled(t)
	_, err := c.member(urls[0]).Remove(urls[3])
	require.ErrorIs(t, err, membership.ErrChangeRefused)
	require.ErrorContains(t, err, "http://n4:1 answers; only a dead node is removed (decommission a live one)")
	_, err = c.member(urls[3]).Remove(urls[3])
	require.ErrorContains(t, err, "this node is http://n4:1 and answers")
	_, err = c.member(urls[0]).Remove("http://n9:1")
	require.ErrorIs(t, err, membership.ErrChangeRefused)
	require.ErrorContains(t, err, "http://n9:1 is not a member")

	c.die(urls[3], logs[urls[3]])
	first, err := c.member(urls[1]).Remove(urls[3])
	require.NoError(t, err)
	require.Equal(t, &clustermap.Change{Kind: clustermap.Decommission, Node: 3, Stage: clustermap.WriteBoth, Driver: 1, Dead: true}, first.Change)
	final := c.settled(l, 3)
	require.Nil(t, final.Node(3), "the dead node left the map")
	last := l.State().Last
	require.Equal(t, maplog.OpRemove, last.Kind)
	require.Equal(t, first.Epoch, last.Began)
	require.False(t, last.Aborted)
	for _, u := range urls[:3] {
		m, self := c.member(u).Map()
		require.Equal(t, final.Epoch, m.Epoch, u)
		require.GreaterOrEqual(t, self, 0, u)
		c.requireLiveSources(u, []*clustermap.Map{first}, 3)
	}
}

// Two members die and no spare machine comes (dhtkvctl remove of each):
// the removal of the first waits for the second's acknowledgement; a
// remove of the second counts it dead in that change (same stage, a new
// epoch), which then finishes without either, and the log removes the
// second by itself once it is over. The gainers of both changes copy from
// the live replicas only. Four members, two replicas: node 2 is a voter
// of the log, node 3 is not, so the log keeps its quorum.
func TestLoggedRemoveTwoDead(t *testing.T) {
	c, urls, logs, l := fourSettled(t)
	c.die(urls[3], logs[urls[3]])
	c.die(urls[2], logs[urls[2]])
	first, err := c.member(urls[0]).Remove(urls[3])
	require.NoError(t, err)
	require.Equal(t, 3, first.Change.Node)
	require.Eventually(t, func() bool {
		st := l.State()
		return st.Map.Epoch == first.Epoch && slices.Equal(st.Waiting(-1), []int{2})
	}, 20*time.Second, 10*time.Millisecond, "the removal of node 3 waits for dead node 2")

	m, err := c.member(urls[1]).Remove(urls[2])
	require.NoError(t, err)
	require.Equal(t, first.Epoch+1, m.Epoch)
	require.Equal(t, *first.Change, *m.Change, "the change goes on at its stage, with its driver")
	require.Equal(t, []int{2}, m.Removing)

	final := c.settled(l, 2)
	require.Nil(t, final.Node(2))
	require.Nil(t, final.Node(3))
	require.Empty(t, final.Removing)
	last := l.State().Last
	require.Equal(t, maplog.OpRemove, last.Kind)
	require.Equal(t, 2, last.Node, "the last change removed node 2")
	require.False(t, last.Aborted)

	// The two changes' first maps, for the partitions each node gained.
	end := m
	for end.Change != nil {
		end, err = end.Advance()
		require.NoError(t, err)
	}
	second, err := end.RemoveNext()
	require.NoError(t, err)
	require.Equal(t, last.Began, second.Epoch)
	for _, u := range urls[:2] {
		got, self := c.member(u).Map()
		require.Equal(t, final.Epoch, got.Epoch, u)
		require.GreaterOrEqual(t, self, 0, u)
		c.requireLiveSources(u, []*clustermap.Map{first, second}, 2, 3)
	}
}

// The leaving node of a decommission dies in its stream stage, its
// gainers' copies held: a remove of a live member is refused; a remove of
// it marks it dead in the change (same stage, a new epoch), and the
// change finishes without it, as a remove, the gainers copying from the
// live replicas only.
func TestLoggedRemoveDuringItsDecommission(t *testing.T) {
	c, urls, logs, l := fourSettled(t)
	c.mu.Lock()
	c.hold = make(chan struct{})
	c.mu.Unlock()
	first, err := c.member(urls[2]).Decommission(urls[2], false)
	require.NoError(t, err)
	var stream uint64
	require.Eventually(t, func() bool {
		st := l.State()
		ch := st.Map.Change
		stream = st.Map.Epoch
		return ch != nil && ch.Stage == clustermap.Stream && slices.Equal(st.Waiting(-1), []int{0, 1, 3})
	}, 20*time.Second, 10*time.Millisecond, "stream, every gainer's copy held")

	c.die(urls[2], logs[urls[2]])
	_, err = c.member(urls[0]).Remove(urls[1])
	require.ErrorIs(t, err, membership.ErrChangeRefused)
	require.ErrorContains(t, err, "http://n2:1 answers", "a live member: the ping refuses it")

	m, err := c.member(urls[1]).Remove(urls[2])
	require.NoError(t, err)
	require.Equal(t, stream+1, m.Epoch)
	require.Equal(t, clustermap.Change{Kind: clustermap.Decommission, Node: 2, Stage: clustermap.Stream, Driver: 1, Dead: true}, *m.Change,
		"the change stays at its stage, its leaving node marked dead, driven by the remover")
	require.Eventually(t, func() bool {
		st := l.State()
		return st.Last != nil && st.Last.Kind == maplog.OpRemove && st.Last.Ended == m.Epoch
	}, 20*time.Second, 10*time.Millisecond, "the remove's outcome")
	c.mu.Lock()
	close(c.hold)
	c.mu.Unlock()
	final := c.settled(l, 3)
	require.Nil(t, final.Node(2), "the dead node left the map")
	last := l.State().Last
	require.Equal(t, maplog.OpRemove, last.Kind, "the decommission ended as a remove")
	require.Equal(t, first.Epoch, last.Began)
	require.False(t, last.Aborted)
	for _, u := range []string{urls[0], urls[1], urls[3]} {
		c.requireLiveSources(u, []*clustermap.Map{first}, 2)
	}
}

// POST /cluster/remove?node=URL: 400 for a missing or malformed node,
// 409 with a one-line reason when the node answers or is not a member,
// 202 with the first map for a dead member.
func TestRemoveAdmin(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	c.settled(logs[urls[0]], 3)
	h := c.member(urls[0]).Handler(nil)
	post := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/cluster/remove"+query, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	q := func(u string) string { return "?node=" + url.QueryEscape(u) }
	for i, tc := range []struct {
		query string
		code  int
		want  string
	}{
		{"", http.StatusBadRequest, "missing node=URL"},
		{q("https://n3:1"), http.StatusBadRequest, "want http://host:port"},
		{q("n3"), http.StatusBadRequest, "bad node URL"},
		{q("http://n9:1"), http.StatusConflict, "http://n9:1 is not a member"},
		{q(urls[2]), http.StatusConflict, "http://n3:1 answers; only a dead node is removed"},
		{q(urls[0]), http.StatusConflict, "this node is http://n1:1 and answers"},
		{"dead", http.StatusAccepted, `"dead":true`},
	} {
		if tc.query == "dead" {
			c.die(urls[2], logs[urls[2]])
			tc.query = q(urls[2])
		}
		code, body := post(tc.query)
		require.Equal(t, tc.code, code, "%d %s: %s", i, tc.query, body)
		require.Contains(t, body, tc.want, tc.query)
		require.NotContains(t, body, "\n", "one line")
	}
	final := c.settled(logs[urls[0]], 2)
	require.Nil(t, final.ByURL(urls[2]))
}

// A node removed while it runs (it answers no member, its links cut; it
// is alive otherwise, and follows the log) stops as soon as it installs the map
// that marks it dead (Options.OnLeft): the cluster counts it dead, and
// nothing it serves is waited for any more; the gainers' copies are held,
// so it stops while still a member, not because it left the map. The
// remove completes without it.
func TestLoggedRemoveStopsANodeMarkedDead(t *testing.T) {
	c, urls, _, l := fourSettled(t)
	c.mu.Lock()
	c.hold = make(chan struct{})
	for _, from := range urls[:3] {
		c.links[[2]string{from, urls[3]}].Cut(true)
	}
	left := c.left[urls[3]]
	c.mu.Unlock()
	m, err := c.member(urls[0]).Remove(urls[3])
	require.NoError(t, err)
	require.True(t, m.Change.Dead)
	select {
	case <-left:
	case <-time.After(20 * time.Second):
		got, _ := c.member(urls[3]).Map()
		t.Fatalf("node 4 did not stop; its map: %s", got)
	}
	got, self := c.member(urls[3]).Map()
	require.Equal(t, 3, self, "still a member: %s", got)
	// Node 1's replica of the log may apply the remove after node 4's.
	require.Eventually(t, func() bool { return l.Map().Epoch >= m.Epoch }, 10*time.Second, 10*time.Millisecond)
	require.NotNil(t, l.Map().Change, "the change is held")
	c.mu.Lock()
	close(c.hold)
	c.mu.Unlock()
	final := c.settled(l, 3)
	require.Nil(t, final.Node(3))
}

// A node that the member asked cannot reach but another member can is
// alive (a cut link): replace and remove refuse it, naming who reaches
// it. Once no member reaches it, it is dead to all, and removed.
func TestLoggedDeadCheckAsksEveryMember(t *testing.T) {
	c, urls, _, l := fourSettled(t)
	c.mu.Lock()
	c.links[[2]string{urls[0], urls[3]}].Cut(true)
	c.mu.Unlock()
	asked := c.member(urls[0])
	_, err := asked.Replace(urls[3], "http://n5:1")
	require.ErrorIs(t, err, membership.ErrChangeRefused)
	require.ErrorContains(t, err, "http://n4:1 answers http://n")
	_, err = asked.Remove(urls[3])
	require.ErrorContains(t, err, "a cut link, not a dead node")
	require.Nil(t, l.Map().Change, "nothing began")

	removeOnceSilent(t, c, l, asked, urls[1:3], urls[3])
}

// A node that answers every member with a refusal (restarted with another
// cluster secret: 403) is alive: it may still serve its clients, and
// replaced it would make versions with its id beside its replacement.
// Replace and remove refuse it with its reason; the member asked to
// vouch for it (Reaches) says it answers too. Once it is silent, it is
// removed.
func TestLoggedDeadCheckCountsARefusalAsAnAnswer(t *testing.T) {
	c, urls, _, l := fourSettled(t)
	refuse := func(e *rpc.Error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, from := range urls[:3] {
			c.links[[2]string{from, urls[3]}].Refuse(e)
		}
	}
	refuse(&rpc.Error{Status: http.StatusForbidden, Msg: "forbidden: missing or wrong cluster secret"})
	asked := c.member(urls[0])
	_, err := asked.Replace(urls[3], "http://n5:1")
	require.ErrorIs(t, err, membership.ErrChangeRefused)
	require.ErrorContains(t, err, "http://n4:1 answers (and refuses this node: ")
	require.ErrorContains(t, err, "status 403: forbidden: missing or wrong cluster secret); only a dead node is replaced")
	_, err = asked.Remove(urls[3])
	require.ErrorContains(t, err, "http://n4:1 answers (and refuses this node: ")
	ok, err := c.member(urls[1]).Reaches(urls[3])
	require.NoError(t, err)
	require.True(t, ok, "another member vouches for it")
	require.Nil(t, l.Map().Change, "nothing began")

	refuse(nil)
	removeOnceSilent(t, c, l, asked, urls[:3], urls[3])
}

// removeOnceSilent cuts the links from froms to the member at dead, has
// asked remove it, and checks that the change counts it dead and that it
// leaves the map.
func removeOnceSilent(t *testing.T, c *cluster, l *maplog.Log, asked *membership.Service, froms []string, dead string) {
	t.Helper()
	c.mu.Lock()
	for _, from := range froms {
		c.links[[2]string{from, dead}].Cut(true)
	}
	c.mu.Unlock()
	m, err := asked.Remove(dead)
	require.NoError(t, err)
	require.True(t, m.Change.Dead)
	final := c.settled(l, 3)
	require.Nil(t, final.ByURL(dead))
}

// fourSettled is a cluster of four members on the log, n1 to n4, with
// the map settled: the cluster, the URLs, each member's replica of the
// log, and n1's.
func fourSettled(t *testing.T) (*cluster, []string, map[string]*maplog.Log, *maplog.Log) {
	t.Helper()
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1", "http://n4:1"}
	c, logs := loggedCluster(t, urls)
	l := logs[urls[0]]
	c.settled(l, 4)
	return c, urls, logs, l
}
