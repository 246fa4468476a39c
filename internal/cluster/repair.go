package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// Read repair
//
// A GET whose answers disagree (an older version, a missing key, a
// tombstone against a value) found replicas that missed a write: a node
// was down, a link was cut, a write failed part-way. Left alone, later
// quorum reads flip between the old and the new value depending on which
// replicas they reach, and a failed write left on one replica can win
// later. So the coordinator writes the newest record it saw back:
//
//   - to the stale replicas among those that answered, and to the replicas
//     it did not hear from (not asked, or not answered in time: likely
//     stale too, and a blind write is harmless under last-write-wins, a
//     replica holding something newer refuses it), all at once;
//   - and it replies only once ack replicas hold that record
//     (RepairBlocking, the default), counting those that answered with
//     it. Every later quorum read then meets one of them and never returns
//     anything older: quorum reads are monotonic. A stale replica that
//     cannot take the record (down, or its clock too far behind to accept
//     the version) is replaced by one not heard from; if ack holders
//     cannot be reached by the request's deadline, the read fails (504)
//     rather than return a value a later read could contradict. The
//     remaining writes finish in the background, bounded by the deadline.
//   - while a membership change is under way, before its read-new stage,
//     reads ask the old replica set and will ask the new one: the
//     repair then goes to both sets and needs ack holders in each, as a
//     write of that stage does; otherwise a read after read-new could
//     meet none of the replicas the repair wrote, and answer older than
//     a read before it (TestReadRepairDuringChangeKeepsReadsMonotonic).
//
// RepairAsync hands all of it to a bounded background queue and replies
// at once (faster, not monotonic); RepairOff leaves disagreements to
// anti-entropy. Reads that agree cost nothing extra. A full queue drops
// the job and counts it.

// RepairMode says what a read does with stale replicas it found.
type RepairMode int

// The read repair modes (--read-repair).
const (
	RepairBlocking RepairMode = iota
	RepairAsync
	RepairOff
)

var repairModes = []string{"blocking", "async", "off"}

func (m RepairMode) String() string { return repairModes[m] }

// Set reads a --read-repair value (flag.Value).
func (m *RepairMode) Set(s string) error {
	mode, err := ParseRepairMode(s)
	if err != nil {
		return err
	}
	*m = mode
	return nil
}

// ParseRepairMode reads a --read-repair value.
func ParseRepairMode(s string) (RepairMode, error) {
	if i := slices.Index(repairModes, s); i >= 0 {
		return RepairMode(i), nil
	}
	return 0, fmt.Errorf("read repair %q: want blocking, async or off", s)
}

// replicaState is what one replica answered to a read.
type replicaState struct {
	node    int
	version uint64
	found   bool
}

// readRepair brings the replicas of key up to best (see above). answered
// are the replicas that answered the read, reps all the key's replicas
// it reads, newReps those of the new set while a membership change is
// under way before read-new (nil otherwise), ack how many must hold best
// before the read may answer, in each set.
func (c *Coordinator) readRepair(r *routes, key []byte, best *record.Record, answered []replicaState, reps, newReps []int, ack, newAck int, deadline time.Time) error {
	var targetBuf [maxReplicas]int
	targets := targetBuf[:0]
	holders := 0
	for _, a := range answered {
		if a.found && a.version >= best.Version {
			holders++
		} else {
			targets = append(targets, a.node)
		}
	}
	if len(targets) == 0 {
		return nil // the answers agree
	}
	stale := len(targets)
	for _, n := range reps {
		if !slices.ContainsFunc(answered, func(a replicaState) bool { return a.node == n }) {
			targets = append(targets, n)
		}
	}
	old, need := targets, ack-holders
	if newReps != nil {
		// A change under way, before read-new: the read asked the old
		// set, and reads will ask the new one from read-new on. Like a
		// write of this stage, best must then reach ack replicas of each
		// set; those that answered with it take it again (the same
		// version, which they keep).
		for _, n := range newReps {
			if !slices.Contains(targets, n) {
				targets = append(targets, n)
			}
		}
		old, need = reps, ack
	}
	env := best.Encode() // copies the value: the cache's or the handler's memory
	if c.repairMode == RepairAsync {
		c.repairs.enqueue(key, env, targets)
		return nil
	}
	// All targets at once, the stale ones and the replicas not heard from:
	// the read answers as soon as ack replicas hold best, and the other
	// writes finish in the background by the deadline. A stale replica
	// that cannot take best (down, or its clock too far behind) is so
	// replaced by one that can.
	n, err := c.fanOut(r, deadline, key, old, newReps, need, newAck, len(old)+len(newReps), fanOp{kind: opRepair},
		func(k []byte) answer { return answer{err: c.applyRepair(r.View, k, env)} },
		func(i int, call *view.Call) {
			call.Env, call.Epoch = env, r.Epoch()
			view.Go(r.peers[i].client, call)
		},
		nil)
	c.m.repairs.WithLabelValues("blocking", "ok").Add(float64(n))
	if err != nil {
		// The replicas that failed or had not answered: n may count
		// holders that took best again (a change under way), so
		// len(targets)-n can be negative, and a counter cannot decrease.
		failed := len(targets) - n
		var re *ReplicasError
		if errors.As(err, &re) {
			failed = len(re.Failed)
		}
		c.m.repairs.WithLabelValues("blocking", "failed").Add(float64(max(failed, 0)))
		return fmt.Errorf("read repair: %d stale of %d answers, %d of %d more replicas hold the newest version: %w", stale, len(answered), n, need, err)
	}
	return nil
}

// applyRepair stores env on the local replica, by the path of every
// record made elsewhere (ApplyRemote). A replica holding something newer
// has done its part.
func (c *Coordinator) applyRepair(v *view.View, key, env []byte) error {
	rec, err := record.Decode(env)
	if err != nil {
		return err
	}
	return c.ApplyRemote(v, key, &rec)
}

// repairQueue runs background repairs: one worker, a bounded queue.
type repairQueue struct {
	repair func(repairJob)
	jobs   chan repairJob
	work   *worker.Group
	// bytes is what the jobs queued or being written hold (their keys
	// and records), at most repairQueueBytes.
	bytes atomic.Int64
	// dropped counts a job the full queue had no room for, by its targets.
	dropped func(targets int)
}

// repairJob writes env under key to targets. It owns its memory.
type repairJob struct {
	key, env []byte
	targets  []int
}

// repairQueueLen bounds the background repairs waiting: a burst of reads
// of a diverged range queues at most this many; the rest is left to the
// next read or to anti-entropy.
const repairQueueLen = 1024

// repairQueueBytes bounds the bytes of the background repairs waiting or
// being written (their keys and records): 1024 records of the largest
// value would be 16 GiB at the default --max-value-bytes. A job beyond it
// is dropped, as one beyond repairQueueLen is (but for one alone: take).
const repairQueueBytes = 64 << 20

func newRepairQueue(repair func(repairJob), dropped func(targets int)) *repairQueue {
	return &repairQueue{repair: repair, dropped: dropped, jobs: make(chan repairJob, repairQueueLen), work: worker.New()}
}

// enqueue queues a repair of key to targets, or counts it dropped when the
// queue is full.
func (q *repairQueue) enqueue(key, env []byte, targets []int) {
	if len(targets) == 0 {
		return
	}
	size := int64(len(key) + len(env))
	if !q.take(size) {
		q.dropped(len(targets))
		return
	}
	job := repairJob{key: bytes.Clone(key), env: env, targets: slices.Clone(targets)}
	select {
	case q.jobs <- job:
	default:
		q.bytes.Add(-size)
		q.dropped(len(targets))
	}
}

// take charges size bytes to repairQueueBytes, and reports whether they
// fit; a job larger than the whole bound is taken when nothing else is
// held (a --max-value-bytes above it).
func (q *repairQueue) take(size int64) bool {
	for {
		used := q.bytes.Load()
		if used+size > repairQueueBytes && used > 0 {
			return false
		}
		if q.bytes.CompareAndSwap(used, used+size) {
			return true
		}
	}
}

// start runs the worker.
func (q *repairQueue) start() {
	q.work.Go(func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case job := <-q.jobs:
				q.repair(job)
				q.bytes.Add(-int64(len(job.key) + len(job.env)))
			}
		}
	})
}

// close stops the worker; queued jobs are dropped (anti-entropy covers
// them).
func (q *repairQueue) close() { q.work.Stop() }

// repairAsync writes a queued job's record to its targets, one by one.
func (c *Coordinator) repairAsync(job repairJob) {
	r := c.route()
	deadline := time.Now().Add(c.timeout)
	for _, n := range job.targets {
		var err error
		switch {
		case n == r.Self:
			err = c.applyRepair(r.View, job.key, job.env)
		case r.peers[n] == nil:
			err = fmt.Errorf("node %d left the cluster", n)
		default:
			_, err = r.peers[n].client.Apply(job.key, job.env, r.Epoch(), deadline)
		}
		result := "ok"
		if err != nil {
			result = "failed"
			c.log.Debug("background read repair failed", "node", r.URL(n), "err", err)
		}
		c.m.repairs.WithLabelValues("async", result).Inc()
	}
}
