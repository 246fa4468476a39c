package placement

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// The stages route as clustermap.Stage says: reads by the old set until
// read-new, writes to both sets while a change is under way.
func TestSetsRouteByStage(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
	m, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	require.False(t, Of(m).Moving)
	join, err := m.BeginJoin("http://127.0.0.1:4", 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		stage   clustermap.Stage
		readNew bool
	}{{clustermap.WriteBoth, false}, {clustermap.Stream, false}, {clustermap.ReadNew, true}} {
		mm := *join
		ch := *join.Change
		ch.Stage = tc.stage
		mm.Change = &ch
		s := Of(&mm)
		require.True(t, s.Moving)
		require.Equal(t, tc.readNew, s.ReadNew)
		moved := 0
		for i := range 2000 {
			key := []byte{byte(i), byte(i >> 8), 'k'}
			old, new := s.WriteSets(key, 2, nil, nil)
			require.Len(t, old, 2)
			require.Len(t, new, 2)
			require.NotContains(t, old, 3, "the joining node is in no old set")
			reads := s.ReadReplicas(key, 2, nil)
			if tc.readNew {
				require.Equal(t, new, reads)
			} else {
				require.Equal(t, old, reads)
			}
			if !slices.Equal(old, new) {
				moved++
			}
		}
		require.Positive(t, moved, "some keys move to the new node")
		// The joining node (id 3) is the one node that gains partitions,
		// each from every replica of the partition's old set.
		require.Equal(t, []int{3}, s.Gainers())
		gains := s.Gains(3)
		require.NotEmpty(t, gains)
		for r, parts := range gains {
			for _, p := range parts {
				require.True(t, s.Holds(p, r), "partition %d is copied from its old replica %d", p, r)
				require.False(t, s.Holds(p, 3))
				require.Contains(t, s.Shared(3, r), p, "a gained partition is shared with its sources")
			}
		}
	}
}
