package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestReadyDuringAGrowthNeedsEveryOldReplica: growing from 3 to 4, a read
// at the default ack (3, a majority of 4) needs all three old replicas
// until read-new (docs/membership.md). With one of them down, the keys it
// holds cannot be read at the defaults, and readiness must say so, as it
// does outside a change when a majority is out of reach: it counted a
// majority of the read set's factor, 2 of 3, and stayed ready.
func TestReadyDuringAGrowthNeedsEveryOldReplica(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 4, func(_ int, cfg *node.Config) {
			cfg.Replicas = 3
			cfg.Move.Rate = partcopy.MinRate // the stream stage lasts
		})
		c.AwaitFormed(time.Minute)
		seedBulk(t, c)
		c.Await(time.Minute, "node 0 ready", func() (bool, string) {
			err := c.Node(0).Ready()
			return err == nil, fmt.Sprint(err)
		})
		code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/replicas?n=4", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		c.Await(time.Minute, "node 0 installed the change", func() (bool, string) {
			m, _ := c.Node(0).Members().Map()
			return m.Change != nil, m.String()
		})
		c.StopNode(3) // the change waits for it from now on
		m, _ := c.Node(0).Members().Map()
		require.NotNil(t, m.Change)
		require.NotEqual(t, clustermap.ReadNew, m.Change.Stage, "reads ask the old set")
		c.Await(time.Minute, "node 0 not ready", func() (bool, string) {
			err := c.Node(0).Ready()
			return errors.Is(err, node.ErrNoQuorum), fmt.Sprint(err)
		})
		require.ErrorContains(t, c.Node(0).Ready(), "fewer than 3 of their 3 replicas reachable")
	})
}

// TestStatusWarnsOfWritesAJoinWaitsFor: a join asked before its node is
// started (docs/membership.md allows either order) puts the node in the
// new replica set of the partitions it gains from write-both on. At
// factor 2 a write at the default ack needs both replicas of each set,
// so writes of those keys fail until the node answers: /v0/status says
// so and names it (a new user met the failures with /readyz at 200 and
// `dhtkvctl status` silent), and an abort ends them.
func TestStatusWarnsOfWritesAJoinWaitsFor(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		status := func() string {
			_, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status", nil)
			return string(body)
		}
		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(0, j))
		c.Await(time.Minute, "node 0 warns of the writes the join waits for", func() (bool, string) {
			s := status()
			return strings.Contains(s, "writes failing: "), s
		})
		require.Contains(t, status(), "join of node 3 at "+c.URL(j)+" (stage write-both)")
		require.Contains(t, status(), "unreachable from here: "+c.URL(j))
		var st client.Status
		_, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status?verbose", nil)
		require.NoError(t, json.Unmarshal(body, &st))
		require.Contains(t, st.WritesFailing, "cannot take writes at the default ack", "what dhtkvctl status exits 1 for")
		require.Empty(t, st.NoQuorum, "reads still have the old set")
		require.NoError(t, c.Node(0).Ready(), "nor is readiness affected")
		failed := 0
		for i := range 40 {
			if code := cl.Put(t, c.URL(0), fmt.Sprintf("k%d", i), []byte("v"), 0, 0); code != http.StatusCreated {
				require.Equal(t, http.StatusGatewayTimeout, code)
				failed++
			}
		}
		require.NotZero(t, failed, "keys of the partitions node 3 gains")
		code, body := cl.Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/abort", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		c.AwaitNoChange(time.Minute)
		require.NotContains(t, status(), "writes failing")
		for i := range 40 {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%d", i), []byte("v"), 0, 0))
		}
	})
}

// TestStatusWarnsOfWritesAReplicasChangeWaitsFor: the same warning names
// a change of the replication factor by its new factor, not by the node
// that drives it ("replicas of node 0" read as if node 0 were moving).
// Factor 1 to 2 with node 2 stopped: the partitions whose new set holds
// node 2 take no write at the new default ack.
func TestStatusWarnsOfWritesAReplicasChangeWaitsFor(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 1 })
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		c.Await(time.Minute, "node 2's acknowledgement of the first map, which a change needs", func() (bool, string) {
			st := c.Node(0).MapLog().State()
			return st.Map != nil && st.Acks[2] >= st.Map.Epoch, fmt.Sprintf("acks %v", st.Acks)
		})
		c.StopNode(2)
		code, body := cl.Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/replicas?n=2", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		c.Await(time.Minute, "node 0 warns of the writes the change waits for", func() (bool, string) {
			_, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status", nil)
			return strings.Contains(string(body), "writes failing: "), string(body)
		})
		_, body = cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status", nil)
		require.Contains(t, string(body), "while the change of the replication factor to 2 (stage write-both)")
		require.Contains(t, string(body), "unreachable from here: "+c.URL(2))
	})
}

// TestSyncedCountsTheCurrentMapOnly: a peer's last complete anti-entropy
// exchange (/v0/status's last_complete, dhtkvctl status's SYNCED) counts
// under the cluster map the node installed last. After a replicas change
// the pair shares other partitions, and an exchange made before it says
// nothing of them: a new user saw SYNCED name an exchange of epoch 1 at
// epoch 18 while the node's snapshot said its completeness was unknown.
func TestSyncedCountsTheCurrentMapOnly(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		lastComplete := func() []*time.Time {
			var st client.Status
			_, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status?verbose", nil)
			require.NoError(t, json.Unmarshal(body, &st))
			var out []*time.Time
			for _, m := range st.Members {
				if !m.Self {
					require.NotNil(t, m.AntiEntropy)
					out = append(out, m.AntiEntropy.LastComplete)
				}
			}
			return out
		}
		for _, ex := range c.Repair(0) {
			require.Empty(t, ex.Error)
		}
		for _, at := range lastComplete() {
			require.NotNil(t, at, "compared with every peer under this map")
		}
		before, _ := c.Node(0).Members().Map()
		code, body := cl.Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/replicas?n=3", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		// The members may not have installed the change when the admin
		// call answers: wait for the map after it.
		c.AwaitStableAfter(before.Epoch, time.Minute)
		for _, at := range lastComplete() {
			require.Nil(t, at, "an exchange under the factor-2 map says nothing of factor 3's replica sets")
		}
		for _, ex := range c.Repair(0) {
			require.Empty(t, ex.Error)
		}
		for _, at := range lastComplete() {
			require.NotNil(t, at)
		}
	})
}
