package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The background read repairs waiting hold their records' bytes, and
// those are bounded, not only their number: with --read-repair=async,
// reads of large values whose replicas disagree (reads racing the writes
// of those keys do) queued up to repairQueueLen jobs whatever their
// size, 1024 × --max-value-bytes (16 GiB at the defaults), while the one
// worker wrote each to its targets in turn. Beyond the bytes, a job is
// dropped and counted, as one beyond the length is.
func TestRepairQueueBoundsItsBytes(t *testing.T) {
	const value = 256 << 10
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	dropped := 0
	q := newRepairQueue(func(repairJob) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release // a worker busy with a slow replica
	}, func(n int) { dropped += n })
	q.start()
	defer q.close()
	defer close(release)

	env := make([]byte, value)
	queued := 0
	for range repairQueueLen {
		before := dropped
		q.enqueue([]byte("k"), env, []int{1})
		if dropped == before {
			queued++
		}
	}
	<-started
	require.Positive(t, dropped, "jobs of %d bytes each were dropped at some point", value)
	const most = 64 << 20 // repairQueueBytes, and the job the worker took
	require.LessOrEqual(t, queued*value, most+value, "bytes of the repairs queued")
}
