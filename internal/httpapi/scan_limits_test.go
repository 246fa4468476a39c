package httpapi_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A cluster scan takes every record its peers stream, whatever this
// node's limits:
//   - a value of --max-value-bytes written with a ttl, whose envelope
//     header is 18 bytes (record.MaxHeaderSize), not 10: the streams'
//     bound left the expiry out, and every cluster scan meeting such a
//     record was cut short, for as long as it lived;
//   - a value over this node's own --max-value-bytes, within its peer's
//     (a rolling change of the flag, or a record stored before the
//     limit was lowered).
func TestClusterScanTakesWhatPeersHold(t *testing.T) {
	const maxValue = 4 << 10
	c := testcluster.Start(t, 2, func(i int, cfg *node.Config) {
		cfg.MaxValueBytes = maxValue
		if i == 1 {
			cfg.MaxValueBytes = 1 << 10 // lowered on this node
		}
	})
	cl := testcluster.NewClient(t)
	val := bytes.Repeat([]byte("v"), maxValue)
	code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(0), "big", 1, 2)+"&ttl=3600", val)
	require.Equal(t, http.StatusCreated, code, "%s", body)

	for i := range 2 {
		resp := testcluster.HTTPGet(t, c.URL(i)+"/v0/entities?start=a&scope=cluster&ack=1&from=2&format=binary")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		recs := testcluster.ReadBinary(t, resp.Body) // fails the test on a truncated stream
		require.Equal(t, [][2]string{{"big", string(val)}}, recs, "through node %d", i)
	}
}
