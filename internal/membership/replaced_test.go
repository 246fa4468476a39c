package membership_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/membership"
)

// A node that was counted dead and replaced, but whose process still runs
// (it was cut off: no member reached it), installs the map that gives its
// id to the new machine: its view has Self -1 and no transport for its
// old id (view.New skips self). Asked whether it reaches the new machine
// (rpc.ReachPath, served by fasthttp, which recovers no panic), or asked
// by an operator to remove or replace it, it called a nil Peer and
// panicked; it now answers that it is no longer a member.
func TestReplacedNodeAnswersWithoutPanic(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	m := c.settled(logs[urls[0]], 3)
	replaced, err := m.Replace(2, "http://n9:1")
	require.NoError(t, err)
	old := c.member(urls[2])
	closeLog(t, logs[urls[2]]) // it no longer follows the log; a peer hands it the map
	_, err = old.Offer(membership.State{Node: 0, Map: replaced}.Encode())
	require.NoError(t, err)
	_, self := old.Map()
	require.Equal(t, -1, self)
	require.NotPanics(t, func() { _, _ = old.Reaches("http://n9:1") })
	require.NotPanics(t, func() { _, _ = old.Remove("http://n9:1") })
}
