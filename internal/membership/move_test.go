package membership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/view"
)

// TestPlanCopy: every gained partition is streamed from exactly one of its
// old replicas and compared with each of the others; the streams are
// spread evenly over the replicas, each partition in ascending order to
// the one of its replicas with the fewest so far.
func TestPlanCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		from map[int][]partition.ID
		bulk map[int][]partition.ID
		rest map[int][]partition.ID
	}{
		{
			name: "every replica holds every gained partition: a third from each",
			from: map[int][]partition.ID{0: {1, 2, 3}, 1: {1, 2, 3}, 2: {1, 2, 3}},
			bulk: map[int][]partition.ID{0: {1}, 1: {2}, 2: {3}},
			rest: map[int][]partition.ID{0: {2, 3}, 1: {1, 3}, 2: {1, 2}},
		},
		{
			name: "to the replica with the fewest so far",
			from: map[int][]partition.ID{0: {1}, 1: {1, 2, 3}, 2: {3, 4}},
			bulk: map[int][]partition.ID{0: {1}, 1: {2}, 2: {3, 4}},
			rest: map[int][]partition.ID{1: {1, 3}},
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

// TestKeptForDead: one replica (--replicas 1), three nodes take a fourth
// that dies in the join and is counted dead in it (clustermap.Map.Removing).
// When the join ends, the partitions it moved to the dead node are kept by
// their old replicas (their only copy: the dead node never copied them),
// every other partition a node does not hold is dropped as usual; and in
// the dead node's removal that follows, the old replicas gain them back
// with no live replica to copy from (liveGains' unsourced), keeping what
// they held.
func TestKeptForDead(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	m, err := clustermap.Seed(urls, 1)
	require.NoError(t, err)
	before := view.New(m, 0, urls[0], func(string) view.Peer { return nil }, time.Now())
	join, err := m.BeginJoin("http://n4:1", 0)
	require.NoError(t, err)
	end, err := join.Remove(3, 0)
	require.NoError(t, err)
	for end.Change != nil {
		end, err = end.Advance()
		require.NoError(t, err)
	}
	require.Equal(t, []int{3}, end.Removing)
	v := view.New(end, 0, urls[0], func(string) view.Peer { return nil }, time.Now())
	kept, moved := 0, 0
	for p := range partition.ID(partition.Count) {
		held, holdsNow := before.Holds(p, 0), v.Holds(p, 0)
		toDead := v.Holds(p, 3)
		require.Equal(t, toDead, keptForDead(v, p), "partition %d", p)
		if held && toDead {
			kept++
		}
		if held && !holdsNow {
			moved++
		}
	}
	require.Positive(t, kept)
	require.Equal(t, moved, kept, "every partition node 0 gave away went to the dead node, and is kept")

	done := *end
	done.Removing = nil
	require.False(t, keptForDead(view.New(&done, 0, urls[0], func(string) view.Peer { return nil }, time.Now()), 0), "nothing counted dead: nothing kept")

	removal, err := end.RemoveNext()
	require.NoError(t, err)
	for removal.Change.Stage != clustermap.Stream {
		removal, err = removal.Advance()
		require.NoError(t, err)
	}
	from, unsourced := liveGains(view.New(removal, 0, urls[0], func(string) view.Peer { return nil }, time.Now()))
	require.Empty(t, from, "the only old replica of what node 0 gains back is the dead node")
	require.Len(t, unsourced, kept)
}

// streamAll streams from every source at once: a failing source is tried
// again until it succeeds, a newer map found by one source (ErrStale)
// ends the others, and the end of ctx ends them all.
func TestStreamAll(t *testing.T) {
	t.Run("every source succeeds", func(t *testing.T) {
		var mu sync.Mutex
		calls := map[int]int{}
		stale := streamAll(t.Context(), []int{0, 1, 2}, time.Millisecond, func(_ context.Context, r int) error {
			mu.Lock()
			defer mu.Unlock()
			calls[r]++
			return nil
		})
		require.False(t, stale)
		require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1}, calls)
	})
	t.Run("a failing source is tried again until it succeeds", func(t *testing.T) {
		var mu sync.Mutex
		calls := map[int]int{}
		stale := streamAll(t.Context(), []int{0, 1}, time.Millisecond, func(_ context.Context, r int) error {
			mu.Lock()
			defer mu.Unlock()
			calls[r]++
			if r == 1 && calls[r] < 3 {
				return errors.New("connection refused")
			}
			return nil
		})
		require.False(t, stale)
		require.Equal(t, map[int]int{0: 1, 1: 3}, calls)
	})
	t.Run("a newer map found by one source ends the others", func(t *testing.T) {
		ended := make(chan error, 1)
		stale := streamAll(t.Context(), []int{0, 1}, time.Hour, func(ctx context.Context, r int) error {
			if r == 1 {
				return fmt.Errorf("copy: %w", partcopy.ErrStale)
			}
			<-ctx.Done() // source 0 streams until stopped
			ended <- ctx.Err()
			return ctx.Err()
		})
		require.True(t, stale)
		require.ErrorIs(t, <-ended, context.Canceled)
	})
	t.Run("the end of ctx ends every source, also one waiting to try again", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		failed := make(chan struct{})
		var once sync.Once
		done := make(chan bool)
		go func() {
			done <- streamAll(ctx, []int{0, 1}, time.Hour, func(ctx context.Context, r int) error {
				if r == 1 {
					once.Do(func() { close(failed) })
					return errors.New("connection refused") // then waits an hour to try again
				}
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-failed
		cancel()
		require.False(t, <-done)
	})
}
