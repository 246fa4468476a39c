package membership_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/placement"
)

// A replicas change goes through the stages of a join over the same nodes:
// growing 2 to 3, every node copies the partitions of which it becomes
// the third replica from both of their old replicas, and the map ends with
// factor 3 everywhere; another change is refused meanwhile.
func TestSetReplicasThroughItsStages(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1", "http://n4:1"}
	c, logs := loggedCluster(t, urls)
	c.settled(logs[urls[0]], 4)
	first, err := c.members[urls[1]].SetReplicas(3)
	require.NoError(t, err)
	require.Equal(t, &clustermap.Change{Kind: clustermap.Replicas, Node: 1, Stage: clustermap.WriteBoth, Driver: 1, Replicas: 3}, first.Change)
	_, err = c.members[urls[0]].SetReplicas(1)
	require.ErrorIs(t, err, membership.ErrChangeRefused, "one change at a time")
	_, err = c.members[urls[0]].Join("http://n5:1")
	require.ErrorIs(t, err, membership.ErrChangeRefused)

	final := c.settled(logs[urls[0]], 4)
	require.Equal(t, 3, final.Replicas)
	require.Len(t, final.Nodes, 4)
	for _, u := range urls {
		got, _ := c.members[u].Map()
		require.Equal(t, 3, got.Replicas, "%s records the new factor", u)
	}

	// Each partition was copied by its third-ranked node from its two old
	// replicas, once each.
	sets := placement.Of(first)
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for id, u := range urls {
		want := map[partition.ID][]int{}
		for r, ps := range sets.Gains(id) {
			for _, p := range ps {
				want[p] = append(want[p], r)
			}
		}
		require.Len(t, c.covered[u], len(want), "%s", u)
		for p, rs := range want {
			require.Len(t, rs, 2)
			require.Equal(t, slices.Sorted(slices.Values(rs)), slices.Sorted(slices.Values(c.covered[u][p])), "%s partition %d", u, p)
		}
		total += len(want)
	}
	require.Equal(t, partition.Count, total, "every partition gains exactly one replica")
}

// POST /cluster/replicas?n=N: 202 with the first map, 400 for a missing or
// malformed n, 409 for a factor the map refuses (with its reason).
func TestReplicasAdmin(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	c.settled(logs[urls[0]], 3)
	// The copies are held: the change asked stays in its stream stage,
	// where the next request finds it under way.
	c.mu.Lock()
	c.hold = make(chan struct{})
	c.mu.Unlock()
	h := c.member(urls[0]).Handler(nil)
	post := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/cluster/replicas"+query, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	for _, tc := range []struct {
		query string
		code  int
		want  string
	}{
		{"", http.StatusBadRequest, "missing n=N"},
		{"?n=x", http.StatusBadRequest, `bad n="x"`},
		{"?n=0", http.StatusBadRequest, "from 1 to the number of nodes"},
		{"?n=9999", http.StatusBadRequest, "bad n"},
		{"?n=4", http.StatusConflict, "replication factor 4 out of range: from 1 to the number of nodes, 3"},
		{"?n=2", http.StatusConflict, "the replication factor is 2 already"},
		{"?n=3", http.StatusAccepted, `"kind":"replicas"`},
		{"?n=1", http.StatusConflict, "another membership change is under way: replicas change to 3, stage stream"},
	} {
		code, body := post(tc.query)
		require.Equal(t, tc.code, code, "%s: %s", tc.query, body)
		require.Contains(t, body, tc.want, tc.query)
		require.NotContains(t, body, "\n", "one line")
		if code == http.StatusAccepted {
			// The next request is made from node 1's replica of the log:
			// wait until it holds the change at the stage it is held in
			// (else the log refuses the next one as made from an older
			// epoch).
			require.Eventually(t, func() bool {
				ch := logs[urls[0]].Map().Change
				return ch != nil && ch.Stage == clustermap.Stream
			}, 10*time.Second, 5*time.Millisecond)
		}
	}
	c.mu.Lock()
	close(c.hold)
	c.mu.Unlock()
	final := c.settled(logs[urls[0]], 3)
	require.Equal(t, 3, final.Replicas)
}
