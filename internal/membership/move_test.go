package membership

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// TestPlanCopy: every gained partition is streamed from exactly one of its
// old replicas and compared with each of the others; the sources are as
// few as cover every partition, the largest first.
func TestPlanCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		from map[int][]partition.ID
		bulk map[int][]partition.ID
		rest map[int][]partition.ID
	}{
		{
			name: "every replica holds every gained partition: one source",
			from: map[int][]partition.ID{0: {1, 2, 3}, 1: {1, 2, 3}, 2: {1, 2, 3}},
			bulk: map[int][]partition.ID{0: {1, 2, 3}},
			rest: map[int][]partition.ID{1: {1, 2, 3}, 2: {1, 2, 3}},
		},
		{
			name: "the replica with the most first",
			from: map[int][]partition.ID{0: {1}, 1: {1, 2, 3}, 2: {3, 4}},
			bulk: map[int][]partition.ID{1: {1, 2, 3}, 2: {4}},
			rest: map[int][]partition.ID{0: {1}, 2: {3}},
		},
		{
			name: "disjoint: every replica a source",
			from: map[int][]partition.ID{3: {7}, 5: {8, 9}},
			bulk: map[int][]partition.ID{3: {7}, 5: {8, 9}},
			rest: map[int][]partition.ID{},
		},
		{
			name: "nothing gained",
			from: map[int][]partition.ID{},
			bulk: map[int][]partition.ID{},
			rest: map[int][]partition.ID{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bulk, rest := planCopy(tc.from)
			got := map[int][]partition.ID{}
			for r, set := range bulk {
				got[r] = set.IDs()
			}
			require.Equal(t, tc.bulk, got)
			require.Equal(t, tc.rest, rest)
			// Each (partition, old replica) pair once, in bulk or rest.
			for r, ps := range tc.from {
				for _, p := range ps {
					inBulk := bulk[r].Has(p)
					inRest := slices.Contains(rest[r], p)
					require.True(t, inBulk != inRest, "partition %d from %d", p, r)
				}
			}
		})
	}
}
