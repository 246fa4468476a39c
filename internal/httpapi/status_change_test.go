package httpapi

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// changeLine: the change under way as /v0/status?verbose says it, with the
// dead members a remove counted dead during it, to be removed after it.
func TestChangeLine(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1", "http://n4:1", "http://n5:1"}
	m, err := clustermap.Seed(urls, 3)
	require.NoError(t, err)
	removal, err := m.Remove(4, 0)
	require.NoError(t, err)
	both, err := removal.Remove(3, 0)
	require.NoError(t, err)
	after := both
	for after.Change != nil {
		after, err = after.Advance()
		require.NoError(t, err)
	}
	grow, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	grow, err = grow.BeginReplicas(3, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		m    *clustermap.Map
		want string
	}{
		{"none", m, ""},
		{"a remove", removal, "decommission of http://n5:1 at stage write-both"},
		{"a remove and a node counted dead", both, "decommission of http://n5:1 at stage write-both; http://n4:1 dead, to be removed"},
		{"the change over, the node not removed yet", after, "http://n4:1 dead, to be removed"},
		{"a replicas change", grow, "replication factor 2 to 3 at stage write-both"},
	} {
		require.Equal(t, tc.want, changeLine(tc.m), tc.name)
	}
}
