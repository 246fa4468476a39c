package client_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A membership change the node refuses is ErrChangeRefused, and its
// message says so once, then the node's reason: not "membership change
// refused: membership change refused: ...".
func TestChangeRefusedSaysItOnce(t *testing.T) {
	c := testcluster.Start(t, 2)
	cl, err := client.New(client.Config{Endpoints: urls(c)})
	require.NoError(t, err)
	defer cl.Close()
	admin := c.Node(0).AdminAddr()
	for _, tc := range []struct {
		name   string
		call   func() error
		reason string
	}{
		{"replace a live node", func() error {
			_, err := cl.Replace(ctxFor(t), admin, c.URL(1), "http://127.0.0.1:1")
			return err
		}, "only a dead node is replaced"},
		{"replace a stranger", func() error {
			_, err := cl.Replace(ctxFor(t), admin, "http://127.0.0.1:2", "http://127.0.0.1:1")
			return err
		}, "is not a member"},
		{"decommission a stranger", func() error {
			_, err := cl.Decommission(ctxFor(t), admin, "http://127.0.0.1:2")
			return err
		}, "is not a member"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, client.ErrChangeRefused)
			assert.Equal(t, 1, strings.Count(err.Error(), client.ErrChangeRefused.Error()), "%v", err)
			assert.Contains(t, err.Error(), tc.reason)
		})
	}
}
