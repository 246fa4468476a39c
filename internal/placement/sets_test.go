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
			shared := s.Shared(3, r)
			for _, p := range parts {
				require.True(t, s.Holds(p, r), "partition %d is copied from its old replica %d", p, r)
				require.False(t, s.Holds(p, 3))
				require.True(t, slices.Contains(shared, p), "gained partition %d is shared with its source %d", p, r)
			}
		}
		// Anti-entropy compares a gained partition only once the copy is
		// over (read-new); the old members' shared partitions always.
		for r := range 3 {
			if tc.readNew {
				require.Equal(t, s.Shared(3, r), s.Compared(3, r))
			} else {
				require.Empty(t, s.Compared(3, r), "node 3 gains every partition it shares with %d", r)
			}
			for q := range 3 {
				if q == r {
					continue
				}
				var both []partition.ID
				for p := range partition.Count {
					if s.Holds(partition.ID(p), r) && s.Holds(partition.ID(p), q) {
						both = append(both, partition.ID(p))
					}
				}
				if tc.readNew {
					require.Equal(t, s.Shared(r, q), s.Compared(r, q))
				} else {
					require.Equal(t, both, s.Compared(r, q), "nodes %d and %d", r, q)
				}
			}
		}
	}
	done := join
	for done.Change != nil {
		done, err = done.Advance()
		require.NoError(t, err)
	}
	after := Of(done)
	require.NotEmpty(t, after.Compared(3, 0), "once the change is over, the new node is compared")
	require.Equal(t, after.Shared(3, 0), after.Compared(3, 0))
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

// A replicas change keeps the nodes: each partition's new replicas are the
// first n of its ranking over them, so growing 2 to 3 makes each
// partition's third-ranked node gain it (copied from its two old
// replicas), and shrinking 3 to 2 gains nothing and leaves the third-ranked
// node holding it no more once the change is over. Every question about a
// set is answered with that set's factor.
func TestSetsReplicasChange(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"}
	for _, tc := range []struct {
		name     string
		from, to int
		gainers  []int
		maxRF    int
	}{
		{"grow 2 to 3", 2, 3, []int{0, 1, 2, 3}, 3},
		{"shrink 3 to 2", 3, 2, nil, 3},
		{"grow 1 to 4", 1, 4, []int{0, 1, 2, 3}, 4},
		{"shrink 2 to 1", 2, 1, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := clustermap.Seed(urls, tc.from)
			require.NoError(t, err)
			c, err := m.BeginReplicas(tc.to, 0)
			require.NoError(t, err)
			all := New(m.Nodes)
			for stage := range 3 {
				s := Of(c)
				require.True(t, s.Moving)
				require.Equal(t, stage == 2, s.ReadNew)
				require.Equal(t, tc.from, s.OldFactor)
				require.Equal(t, tc.to, s.NewFactor)
				require.Equal(t, tc.maxRF, s.Replicas)
				require.Equal(t, map[bool]int{false: tc.from, true: tc.to}[stage == 2], s.ReadFactor())
				require.Equal(t, tc.gainers, s.Gainers())
				gained := map[partition.ID]int{}
				for node := range 4 {
					for r, parts := range s.Gains(node) {
						for _, p := range parts {
							gained[p]++
							require.True(t, s.Holds(p, r), "partition %d copied from its old replica %d", p, r)
							require.False(t, s.Holds(p, node))
						}
					}
				}
				for p := range partition.Count {
					part := partition.ID(p)
					ranking := all.PartitionReplicas(part, 4, nil)
					require.Equal(t, ranking[:tc.from], s.OldReplicas(part, nil))
					require.Equal(t, ranking[:tc.to], s.New.PartitionReplicas(part, s.NewFactor, nil))
					if tc.to > tc.from {
						// Each gainer of part copies it from every old replica.
						require.Equal(t, (tc.to-tc.from)*tc.from, gained[part], "partition %d", p)
					} else {
						require.Zero(t, gained[part])
					}
					for i, n := range ranking {
						require.Equal(t, i < max(tc.from, tc.to), s.Receives(part, n), "partition %d rank %d", p, i)
					}
				}
				key := []byte("some key")
				part, _ := partition.Of(key)
				ranking := all.PartitionReplicas(part, 4, nil)
				old, new := s.WriteSets(key, tc.maxRF, nil, nil)
				require.Equal(t, ranking[:tc.from], old, "a set is asked for at most its own factor")
				require.Equal(t, ranking[:tc.to], new)
				require.Equal(t, ranking[:map[bool]int{false: tc.from, true: tc.to}[stage == 2]], s.ReadReplicas(key, tc.maxRF, nil))
				c, err = c.Advance()
				require.NoError(t, err)
			}
			// Over: the new factor is every set's, and the nodes that lost
			// partitions hold them no more (what the mover drops).
			s := Of(c)
			require.False(t, s.Moving)
			require.Equal(t, tc.to, s.OldFactor)
			require.Equal(t, tc.to, s.NewFactor)
			for p := range partition.Count {
				ranking := all.PartitionReplicas(partition.ID(p), 4, nil)
				for i, n := range ranking {
					require.Equal(t, i < tc.to, s.Holds(partition.ID(p), n))
				}
			}
		})
	}
}
