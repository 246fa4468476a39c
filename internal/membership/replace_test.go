package membership_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/membership"
)

// A member that dies in the stream stage of a change is replaced without
// waiting for it (docs/membership.md, "A member that dies during a
// change"). A replicas change 2 → 3 over three nodes, in which every node
// gains partitions: nodes 1 and 2 copy theirs, node 3's copy is held, and
// node 3 dies. The replace keeps the change in its stream stage; nodes 1
// and 2 do not copy again (their copies stand: the replace moves no
// partition), and the stage waits for the new machine alone, which
// copies its gains but acknowledges nothing while it rebuilds. Once its
// rebuild is done it acknowledges, and the change runs to its end with
// the new machine as node 3.
func TestLoggedReplaceDeadMemberInStream(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	const fresh = "http://n9:1"
	c, logs := loggedCluster(t, urls)
	l := logs[urls[0]]
	c.settled(l, 3)
	held := make(chan struct{})
	defer close(held)
	rebuilding := &atomic.Bool{}
	rebuilding.Store(true)
	c.mu.Lock()
	c.holdFrom = map[string]chan struct{}{urls[2]: held}
	c.rebuilding = map[string]*atomic.Bool{fresh: rebuilding}
	c.mu.Unlock()

	first, err := c.member(urls[0]).SetReplicas(3)
	require.NoError(t, err)
	var stream uint64
	require.Eventually(t, func() bool {
		st := l.State()
		ch := st.Map.Change
		if ch == nil || ch.Stage != clustermap.Stream {
			return false
		}
		stream = st.Map.Epoch
		return st.Copied[0] >= stream && st.Copied[1] >= stream && slices.Equal(st.Waiting(-1), []int{2})
	}, 20*time.Second, 10*time.Millisecond, "nodes 1 and 2 copied, node 3's copy held")
	copies := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.copied[urls[0]]) + len(c.copied[urls[1]])
	}
	before := copies()

	c.die(urls[2], logs[urls[2]]) // node 3
	m, err := c.member(urls[1]).Replace(urls[2], fresh)
	require.NoError(t, err)
	require.Equal(t, stream+1, m.Epoch)
	require.Equal(t, first.Change.Kind, m.Change.Kind)
	require.Equal(t, clustermap.Stream, m.Change.Stage, "the change stays at its stage")
	require.Equal(t, 2, m.ByURL(fresh).ID)
	require.Eventually(t, func() bool {
		st := l.State()
		return st.Map.Epoch == m.Epoch && slices.Equal(st.Waiting(-1), []int{2})
	}, 20*time.Second, 10*time.Millisecond, "every other member acknowledged the replace; the stage waits for the new machine")
	require.Equal(t, before, copies(), "the copies made before the replace stand")
	st := l.State()
	require.Equal(t, m.Epoch, st.Copied[0])
	require.Equal(t, m.Epoch, st.Copied[1])
	require.NotNil(t, st.Current)
	require.Equal(t, maplog.OpReplicas, st.Current.Kind, "the change under way is still the replicas change")
	require.Equal(t, maplog.OpReplace, st.Last.Kind)

	// The new machine: its log, at its own address, and its service.
	net9 := listenLog(t)
	l9 := openLog(t, net9, 2)
	res, err := l.Submit(ctxFor(t, 20*time.Second), maplog.Command{Op: maplog.OpAddr, Node: 2, Addr: net9.Addr().String()})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.Reason)
	got, self, err := membership.AwaitMember(ctxFor(t, 20*time.Second), l9, fresh)
	require.NoError(t, err)
	require.Equal(t, 2, self)
	c.startWith(got, fresh, l9)
	require.Eventually(t, func() bool {
		st := l.State()
		return st.Copied[2] >= m.Epoch
	}, 20*time.Second, 10*time.Millisecond, "the new machine copied its gains")
	// Rebuilding, it holds its acknowledgement: the stage waits. Polled
	// over a second, five of the service's retries of a held
	// acknowledgement.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		st := l.State()
		require.Equal(t, m.Epoch, st.Map.Epoch, "the stage waits for the new machine's acknowledgement")
		require.Less(t, st.Acks[2], m.Epoch)
		require.Equal(t, m.Epoch, c.member(fresh).Epoch(), "the new machine installed the map")
	}

	rebuilding.Store(false)
	final := c.settled(l, 3)
	require.Equal(t, 3, final.Replicas)
	require.Equal(t, fresh, final.Node(2).URL)
	last := l.State().Last
	require.Equal(t, maplog.OpReplicas, last.Kind)
	require.False(t, last.Aborted)
	require.Equal(t, first.Epoch, last.Began)
}
