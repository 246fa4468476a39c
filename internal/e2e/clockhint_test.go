package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestRefusedTooFarAheadIsHinted: node 2's clock is 2 s behind (the
// one clock off). A write through node 0 with ack=2 from=3 is acknowledged
// by nodes 0 and 1; node 2 refuses its version (too far ahead of its
// clock). docs/replication.md: "A refused record stays where it is (on the
// node that made it, in its coordinator's hints) and is refused again until
// this clock is within the bound of it." The coordinator must keep a hint
// for node 2, as for any replica that missed the write for a reason that
// passes; it kept none (fanout.go hinted no rpc.IsRefused error; the
// refusal of a version too far ahead now says so, rpc.ErrAhead).
func TestRefusedTooFarAheadIsHinted(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		r := startSkewed(t, 3, 2, -2*time.Second, 1)
		k := r.keys[0]
		require.Equal(t, http.StatusCreated, r.put(0, k, "acked", 2))
		time.Sleep(time.Second) // stragglers finished; hints stored
		hints := r.c.Hints(0)
		t.Logf("node 0 hints: %v", hints)
		var onNode2 bool
		for _, e := range r.c.Replica(2) {
			if e.Key == k {
				onNode2 = true
			}
		}
		require.False(t, onNode2, "node 2 refused the write (its clock is behind)")
		require.Contains(t, hints[2], k, "node 2 refused an acknowledged write's version as too far ahead for now; no hint keeps it")
	})
}
