package placement

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
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

// Receives is membership of a write's targets: a node receives a
// partition's writes while it is a replica of the old set or, during a
// change, of the new set; once the change is over (the new set is the
// map's only set) a node that gave the partition away receives none.
func TestSetsReceives(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
	m, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	join, err := m.BeginJoin("http://127.0.0.1:4", 0)
	require.NoError(t, err)
	done := join
	for done.Change != nil {
		done, err = done.Advance()
		require.NoError(t, err)
	}
	during, after := Of(join), Of(done)
	checked := 0
	for p := range partition.Count {
		part := partition.ID(p)
		old := during.Old.PartitionReplicas(part, 2, nil)
		new := during.New.PartitionReplicas(part, 2, nil)
		for node := range 4 {
			inOld, inNew := slices.Contains(old, node), slices.Contains(new, node)
			require.Equal(t, inOld || inNew, during.Receives(part, node), "partition %d, node %d, during the change", p, node)
			require.Equal(t, inNew, after.Receives(part, node), "partition %d, node %d, after it", p, node)
			if inOld && !inNew {
				checked++ // gave it away: receives it during the change only
			}
		}
	}
	require.Positive(t, checked, "the join moves partitions away from old replicas")
}
