package maplog

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// A join at a replaced node's former URL gets a seed of its own from the
// log's rules 2 (clustermap.Map.BeginJoin); under rules 1, which members
// of an earlier release apply, it shares the replaced node's, as that
// release's members compute it: every member of the log must make the
// same map of a command, whatever release it runs.
func TestJoinSeedByTheLogsRules(t *testing.T) {
	for _, rules := range []int{1, 2} {
		do := applier(t, newFSM())
		urls := []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"}
		m, err := clustermap.Seed(urls, 1)
		require.NoError(t, err)
		require.True(t, do(Command{Op: OpSeed, Map: m}).Accepted)
		for i := range 3 {
			require.True(t, do(Command{Op: OpAck, Node: i, Epoch: 1, Rules: rules}).Accepted)
		}
		res := do(Command{Op: OpReplace, ID: "r", Epoch: 1, From: 0, Node: 2, URL: "http://127.0.0.1:9082"})
		require.True(t, res.Accepted, res.Reason)
		for i := range 3 {
			require.True(t, do(Command{Op: OpAck, Node: i, Epoch: 2, Rules: rules}).Accepted)
		}
		res = do(Command{Op: OpJoin, ID: "j", Epoch: 2, From: 0, URL: urls[2]}) // the freed URL
		require.True(t, res.Accepted, res.Reason)
		joined, replaced := res.Map.ByURL(urls[2]), res.Map.Node(2)
		if rules < 2 {
			require.Equal(t, replaced.Seed, joined.Seed, "rules %d: the seed of the URL's hash, shared", rules)
		} else {
			require.NotEqual(t, replaced.Seed, joined.Seed, "rules %d: a seed of its own", rules)
		}
	}
}
