package membership_test

import (
	"context"
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
