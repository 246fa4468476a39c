package store

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// TestHeldAndDropPartition: Held finds exactly the partitions asked about
// that hold a record (a tombstone counts), and a partition dropped holds
// none afterwards while the others keep theirs.
func TestHeldAndDropPartition(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	byPart := map[partition.ID][]string{}
	for i := range 300 {
		key := fmt.Sprintf("h%d", i)
		var value []byte
		if i%5 != 0 {
			value = []byte("v")
		}
		put(t, s, key, 1, value)
		p, _ := partition.Of([]byte(key))
		byPart[p] = append(byPart[p], key)
	}
	all := func(partition.ID) bool { return true }
	held, err := s.Held(all)
	require.NoError(t, err)
	require.Equal(t, slices.Sorted(maps.Keys(byPart)), held)

	odd := func(p partition.ID) bool { return p%2 == 1 }
	oddHeld, err := s.Held(odd)
	require.NoError(t, err)
	for _, p := range oddHeld {
		require.True(t, odd(p))
		require.NotEmpty(t, byPart[p])
	}

	victim := held[0]
	removed, err := s.DropPartition(victim)
	require.NoError(t, err)
	require.Len(t, removed, len(byPart[victim]))
	after, err := s.Held(all)
	require.NoError(t, err)
	require.Equal(t, held[1:], after)
	for _, key := range byPart[held[1]] {
		_, found, err := s.Version([]byte(key))
		require.NoError(t, err)
		require.True(t, found, "a partition not dropped keeps %s", key)
	}
	for _, key := range byPart[victim] {
		_, found, err := s.Version([]byte(key))
		require.NoError(t, err)
		require.False(t, found, "%s dropped", key)
	}
}
