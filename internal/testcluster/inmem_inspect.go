package testcluster

import (
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/store"
)

// Entry is one record of a replica, as Replica shows it.
type Entry struct {
	Key       string
	Value     string
	Tombstone bool
	Version   uint64
}

// Replica returns what running node i's store holds, every record with
// its tombstones, in key order.
func (c *InMemory) Replica(i int) []Entry {
	c.t.Helper()
	n := c.Node(i)
	require.NotNil(c.t, n, "node %d is stopped", i)
	it, err := n.Store().NewIter(nil, nil)
	require.NoError(c.t, err)
	defer it.Close()
	var out []Entry
	for it.Next() {
		r := it.Record()
		out = append(out, Entry{Key: string(it.Key()), Value: string(r.Value), Tombstone: r.Tombstone, Version: r.Version})
	}
	require.NoError(c.t, it.Err())
	return out
}

// Hints returns the keys of the hints running node i keeps, by the index
// of the node they are for (-1: one its map no longer has), each list in
// key order.
func (c *InMemory) Hints(i int) map[int][]string {
	c.t.Helper()
	n := c.Node(i)
	require.NotNil(c.t, n, "node %d is stopped", i)
	bytes, err := n.Store().HintBytes()
	require.NoError(c.t, err)
	m, _ := n.Members().Map()
	out := map[int][]string{}
	for target := range bytes { // a member's id, not an index
		var keys []string
		require.NoError(c.t, n.Store().Hints(target, nil, func(h store.Hint) bool {
			keys = append(keys, string(h.Key))
			return true
		}))
		if len(keys) > 0 {
			slices.Sort(keys)
			to := -1
			if member := m.Node(target); member != nil {
				to = c.Index(member.URL)
			}
			out[to] = append(out[to], keys...)
		}
	}
	return out
}
