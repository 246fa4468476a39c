package e2e_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestPeersWithOtherSettings: node 2 runs with a longer --gc-grace (1 h)
// than the others (1 s), as after an operator changed the flag on one
// node only. Every node's status names the peer whose setting differs and
// the metric counts such peers. Node 2's snapshot records the shortest
// grace in the cluster, so a node started on it once that grace (less the
// skew bound) has passed is refused, though node 2's own grace would have
// let it start: the others collect deletes after theirs.
func TestPeersWithOtherSettings(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3, withGC(), func(i int, cfg *node.Config) { // grace 1 s, skew bound 500 ms
		if i == 2 {
			cfg.GC.Grace = time.Hour
		}
	})
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("v"), 3, 3))

	const must = ": --gc-grace, --hint-window and --max-clock-skew must be the same on every node"
	want := map[int][]string{
		0: {"peer " + c.URL(2) + " runs with --gc-grace=1h0m0s (this node: 1s)" + must},
		1: {"peer " + c.URL(2) + " runs with --gc-grace=1h0m0s (this node: 1s)" + must},
		2: {
			"peer " + c.URL(0) + " runs with --gc-grace=1s (this node: 1h0m0s)" + must,
			"peer " + c.URL(1) + " runs with --gc-grace=1s (this node: 1h0m0s)" + must,
		},
	}
	for i, lines := range want {
		testcluster.Eventually(t, testcluster.WaitFor, "node's status names the peers with other settings", func() bool {
			code, body := cl.Do(t, http.MethodGet, c.URL(i)+"/v0/status", nil)
			for _, l := range lines {
				if code != http.StatusOK || !strings.Contains(string(body), l) {
					return false
				}
			}
			return true
		})
		require.Equal(t, float64(len(lines)), c.Metric(t, i, "dhtkv_peers_with_other_settings"), "node %d", i)
	}

	c.Repair(t, 2)
	ctl, err := client.New(client.Config{Endpoints: []string{c.URL(2)}})
	require.NoError(t, err)
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := ctl.Snapshot(ctx, c.Node(2).AdminAddr(), "mixed")
	require.NoError(t, err)
	require.NotNil(t, snap.CompleteAsOf)
	time.Sleep(1500 * time.Millisecond) // the behaviour under test: older than the others' grace less the skew bound
	data := c.Config(2).DataDir
	c.StopNode(2)
	require.NoError(t, os.RemoveAll(data))
	require.NoError(t, os.Rename(snap.Dir, data))
	_, err = node.New(c.Config(2))
	require.ErrorContains(t, err, "longer than the shortest --gc-grace among the cluster's nodes when it was taken (1s) less --max-clock-skew (500ms): the other replicas may have collected deletes made since")
}
