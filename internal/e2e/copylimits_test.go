package e2e_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestJoinCopiesMaxSizeExpiringValues: a join copies its gained
// partitions by record streams, and a value of --max-value-bytes written
// with a ttl (an envelope of the value and 18 bytes of header) is one of
// them. The streams' bound left the expiry out: every copy failed on it
// and the join stayed in its stream stage for good.
func TestJoinCopiesMaxSizeExpiringValues(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const maxValue = 4 << 10
		c := testcluster.StartInMemory(t, 2, func(_ int, cfg *node.Config) { cfg.MaxValueBytes = maxValue })
		c.AwaitFormed(30 * time.Second)
		cl := c.Client()
		val := bytes.Repeat([]byte("v"), maxValue)
		for i := range 8 {
			k := fmt.Sprintf("k%d", i)
			code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(0), k, 2, 2)+"&ttl=3600", val)
			require.Equal(t, http.StatusCreated, code, "%s", body)
		}
		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(0, j))
		c.StartNode(j)
		c.AwaitStable(time.Minute)
		for i := range 8 {
			code, got := cl.Get(t, c.URL(j), fmt.Sprintf("k%d", i), 2, 2)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, val, got)
		}
	})
}
