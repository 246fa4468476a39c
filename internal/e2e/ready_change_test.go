package e2e_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
