package membership_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// A member holding another map of the log's epoch (a seed node started
// with another --replicas: the cluster's id hashes only the URLs, so
// every seed makes an epoch-1 map of the same cluster, and the first
// proposed wins the log) installs the log's and acknowledges only that:
// it acknowledged its own, and the log counted it as routing by replica
// sets it did not route by.
func TestFollowInstallsTheLogsMapOfItsEpoch(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	logMap, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	odd, err := clustermap.Seed(urls, 3) // the third seed's --replicas 3
	require.NoError(t, err)
	require.Equal(t, logMap.Cluster, odd.Cluster)
	require.Equal(t, logMap.Epoch, odd.Epoch)

	c, logs := loggedClusterOf(t, urls, logMap, func(i int, m *clustermap.Map) *clustermap.Map {
		if i == 2 {
			return odd // its own seed, stored before the log had one
		}
		return m
	})
	l := logs[urls[0]]
	consistent := func() bool {
		st := l.State()
		for _, n := range st.Map.Nodes {
			m, _ := c.member(n.URL).Map()
			if st.Acks[n.ID] >= st.Map.Epoch && m.Epoch == st.Map.Epoch && !bytes.Equal(m.Encode(), st.Map.Encode()) {
				t.Logf("the log counts node %d as having installed %s; it holds a map of factor %d (the log's: %d)", n.ID, st.Map, m.Replicas, st.Map.Replicas)
				return false
			}
		}
		return true
	}
	require.Never(t, func() bool { return !consistent() }, time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		m, _ := c.member(urls[2]).Map()
		return m.Replicas == logMap.Replicas && l.State().Acks[2] >= logMap.Epoch
	}, 10*time.Second, 10*time.Millisecond, "node 3 installs and acknowledges the log's map")
}
