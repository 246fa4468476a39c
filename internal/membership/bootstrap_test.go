package membership_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/store"
)

// A node started with --join takes the member's map once it names the
// node: at once when the change that adds it came first, after some
// polls when the node was started first (issue 24: it exited 1), and
// never past its wait or a stop asked meanwhile.
func TestBootstrapJoinWaits(t *testing.T) {
	seeds := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	before, err := clustermap.Seed(seeds, 2)
	require.NoError(t, err)
	after, err := before.BeginJoin("http://n4:1", 0)
	require.NoError(t, err)
	stopped, stop := context.WithCancel(context.Background())
	stop()
	for _, tc := range []struct {
		name     string
		joinedAt int // the fetch (from 1) that first answers the map with the node; 0: none
		wait     time.Duration
		ctx      context.Context
		fetches  int64  // how many fetches, exactly
		err      string // "" when it joins
	}{
		{name: "joined before the start", joinedAt: 1, wait: time.Minute, fetches: 1},
		{name: "started before the join", joinedAt: 3, wait: time.Minute, fetches: 3},
		{name: "no wait: refused at once", joinedAt: 2, wait: 0, fetches: 1, err: "is not in the cluster map of http://n1:1"},
		{name: "wait over", joinedAt: 0, wait: 3 * membership.JoinPoll / 2, fetches: 2, err: "add it with dhtkvctl join http://n4:1"},
		{name: "stopped while waiting", joinedAt: 0, wait: time.Minute, ctx: stopped, fetches: 1, err: "stopped while waiting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
			require.NoError(t, err)
			defer st.Close()
			var n atomic.Int64
			b := membership.Bootstrap{
				DataDir: "d", Self: "http://n4:1", Join: "http://n1:1", Wait: tc.wait, Ctx: tc.ctx,
				Fetch: func(string) ([]byte, error) {
					i := n.Add(1)
					m := before
					if tc.joinedAt > 0 && i >= int64(tc.joinedAt) {
						m = after
					}
					return membership.State{Node: 0, Map: m}.Encode(), nil
				},
			}
			m, self, joined, err := b.Map(st)
			require.Equal(t, tc.fetches, n.Load())
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				_, stored, serr := st.ClusterMap()
				require.NoError(t, serr)
				require.False(t, stored, "nothing stored")
				return
			}
			require.NoError(t, err)
			require.True(t, joined)
			require.Equal(t, 3, self)
			require.Equal(t, after.Epoch, m.Epoch)
		})
	}
}

// A node restarted from its data directory asks the other members for
// their maps first, and refuses to start (ErrLeft, with the reason) when
// the cluster gave up on it while it was down: removed, replaced, or
// being removed as dead. Its records may be older than deletes the
// cluster collected since. Answers that tell nothing newer (none, an
// older map, another cluster's, one that still has the node) let it start.
func TestBootstrapRemovedWhileDown(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1", "http://n4:1"}
	stored, err := clustermap.Seed(urls, 3)
	require.NoError(t, err)
	removing, err := stored.Remove(3, 0)
	require.NoError(t, err)
	removed := removing
	for removed.Change != nil {
		removed, err = removed.Advance()
		require.NoError(t, err)
	}
	replaced, err := stored.Replace(3, "http://n9:1")
	require.NoError(t, err)
	joining, err := stored.BeginJoin("http://n5:1", 0)
	require.NoError(t, err)
	other, err := clustermap.Seed([]string{"http://x1:1", "http://n2:1", "http://n3:1", "http://n4:1"}, 3)
	require.NoError(t, err)
	other.Epoch = 9
	for _, tc := range []struct {
		name    string
		answers map[string]*clustermap.Map // by member URL; absent: it does not answer
		err     string
	}{
		{"removed", map[string]*clustermap.Map{urls[1]: removed}, "node 3 (http://n4:1), which was removed from the cluster (or decommissioned) while it was down"},
		{"removed, the newest answer wins", map[string]*clustermap.Map{urls[0]: stored, urls[1]: removing, urls[2]: removed}, "node 3 (http://n4:1), which was removed from the cluster"},
		{"replaced", map[string]*clustermap.Map{urls[0]: replaced}, "node 3 (http://n4:1), which was replaced by http://n9:1 while it was down"},
		{"being removed", map[string]*clustermap.Map{urls[2]: removing}, "node 3 (http://n4:1), which is being removed from the cluster as dead"},
		{"no member answers", nil, ""},
		{"the same map", map[string]*clustermap.Map{urls[0]: stored, urls[1]: stored, urls[2]: stored}, ""},
		{"a newer map with the node", map[string]*clustermap.Map{urls[1]: joining}, ""},
		{"another cluster's", map[string]*clustermap.Map{urls[0]: other}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
			require.NoError(t, err)
			defer st.Close()
			require.NoError(t, st.SetClusterMap(stored.Encode()))
			require.NoError(t, st.SetIdentity(store.Identity{Cluster: stored.Cluster, Node: 3, Formed: true}))
			b := membership.Bootstrap{
				DataDir: "d", Self: urls[3],
				Fetch: func(u string) ([]byte, error) {
					require.NotEqual(t, urls[3], u, "not itself")
					m := tc.answers[u]
					if m == nil {
						return nil, errors.New("connection refused")
					}
					return membership.State{Node: stored.ByURL(u).ID, Map: m}.Encode(), nil
				},
			}
			m, self, joined, err := b.Map(st)
			if tc.err == "" {
				require.NoError(t, err)
				require.Equal(t, 3, self)
				require.False(t, joined)
				require.Equal(t, stored.Epoch, m.Epoch, "the stored map")
				return
			}
			require.ErrorIs(t, err, membership.ErrLeft)
			require.ErrorContains(t, err, "data directory d belongs to "+tc.err)
			require.ErrorContains(t, err, "its records may be older than deletes the cluster has collected since")
		})
	}
}
