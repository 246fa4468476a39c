package testcluster

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// The plumbing: three nodes in memory replicate a write, a stopped node
// keeps its data across a restart, and a wiped one starts empty.
func TestInMemorySmoke(t *testing.T) {
	c := StartInMemory(t, 3)
	cl := c.Client()
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "a", []byte("x"), 3, 3))
	for i := range 3 {
		code, body := cl.Get(t, c.URL(i), "a", 1, 1)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "x", string(body))
		require.Len(t, c.Replica(i), 1)
	}
	c.StopNode(1)
	c.StartNode(1)
	require.Equal(t, []Entry{{Key: "a", Value: "x", Version: c.Replica(0)[0].Version}}, c.Replica(1))
}
