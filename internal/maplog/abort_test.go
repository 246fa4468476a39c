package maplog

import (
	"encoding/json"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// An abort is a change with an ID (isChange, Log.encode) so that, sent
// again after an uncertain outcome (the leader applied it and lost its
// office before it answered: Submit tries again with the same bytes),
// it is answered with the first attempt's outcome. Its ID was recorded
// nowhere (its outcome carries the aborted change's ID), so the retry was
// refused "the map moved on", and the operator told 409 for an abort that
// took effect.
func TestAbortSentAgainIsAnsweredAsTheFirst(t *testing.T) {
	do := applier(t, newFSM())
	urls := []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"}
	m, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	require.True(t, do(Command{Op: OpSeed, Map: m}).Accepted)
	for i := range 3 {
		require.True(t, do(Command{Op: OpAck, Node: i, Epoch: 1, Rules: Rules}).Accepted)
	}
	res := do(Command{Op: OpJoin, ID: "join-1", Epoch: 1, From: 0, URL: "http://127.0.0.1:8083"})
	require.True(t, res.Accepted, res.Reason)

	abort := Command{Op: OpAbort, ID: "abort-1", Epoch: 2, From: 1}
	first := do(abort)
	require.True(t, first.Accepted, first.Reason)
	again := do(abort) // the same request, sent again by Submit
	require.True(t, again.Accepted, "an abort sent again after it was applied: %s", again)
}

// applier returns a function that applies a command to f as the next
// entry of the log and returns its result.
func applier(t *testing.T, f *fsm) func(Command) *Result {
	idx := uint64(0)
	return func(c Command) *Result {
		b, err := json.Marshal(c)
		require.NoError(t, err)
		idx++
		return f.Apply(&raft.Log{Index: idx, Data: b}).(*Result)
	}
}
