package membership_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
)

// A member does not acknowledge a new map while a garbage collection
// decided under the old one is committing (store.Store.Collect's still,
// checked under the lock the install then waits for): a change's moves,
// which wait for every member's acknowledgement, never run beside a
// removal that relied on the old map's replica sets (package gc's
// rule 1).
func TestInstallWaitsForACollectionCommitting(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	c.settled(logs[urls[0]], 3)
	c.mu.Lock()
	st := c.stores[urls[1]]
	c.mu.Unlock()
	held := c.member(urls[1]).View()

	entered, release := make(chan struct{}), make(chan struct{})
	withdrawn := make(chan error, 1)
	go func() {
		// A collection of nothing: what is under test is its commit's
		// place against the install, not what it removes.
		_, err := st.Collect(nil, 1, func() bool {
			close(entered)
			<-release
			return c.member(urls[1]).View() == held
		})
		withdrawn <- err
	}()
	<-entered

	first, err := c.member(urls[0]).Join("http://n4:1")
	require.NoError(t, err)
	require.Equal(t, clustermap.WriteBoth, first.Change.Stage)
	require.Eventually(t, func() bool { return c.member(urls[1]).Epoch() == first.Epoch },
		10*time.Second, time.Millisecond, "node 2 installs the map")
	waiting := func() bool {
		st := logs[urls[0]].State()
		return st.Map.Epoch == first.Epoch && slices.Contains(st.Waiting(-1), 1)
	}
	require.Never(t, func() bool { return !waiting() }, 300*time.Millisecond, 10*time.Millisecond,
		"node 2 acknowledged the map while a collection was committing")
	close(release)
	require.ErrorIs(t, <-withdrawn, store.ErrCollectWithdrawn, "the collection saw the new map")
	require.Eventually(t, func() bool { return !waiting() }, 10*time.Second, 10*time.Millisecond,
		"node 2 acknowledges the map once the collection withdrew")
}
