package cluster

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Rebuild
//
// A node listed in a cluster that starts with an empty data directory (a
// wiped or replaced disk) must not answer reads as an authoritative empty
// replica: its "never written" would count as an answer, and with the
// replicas that hold a key down or stale, quorum reads would answer 404
// for acknowledged writes. So such a node first copies its share: it
// streams every peer's records (the stream of cluster-wide scans, tombstones
// included) and applies them, newest version winning as for any write.
// Meanwhile:
//
//   - its replica takes writes as usual (it must not miss new ones), but
//     refuses reads, locally and from other coordinators, so a read is
//     served by the other replicas (spares are asked at once);
//   - its stream is refused to cluster scans, which then count it as a
//     node that did not answer;
//   - /v0/status says "rebuilding".
//
// The node serves reads once every peer's stream was copied to its end; a
// peer that does not answer is tried again every retry interval. Every
// peer is needed: an acknowledged write may be on this node and on a
// single other one. The state is in the data directory's identity
// (store.Identity), so a node that stops while rebuilding resumes at its
// next start. Records are copied to the node whatever the requests' from
// (every node holds every key at the default from, which is the cluster
// size); copying a key to a node a smaller from did not pick only costs
// its space.

// rebuildBatch bounds the records applied in one store commit.
const rebuildBatch = 256

// rebuildRetry is how long a rebuild waits before asking again the peers
// whose stream failed.
const rebuildRetry = time.Second

type rebuilder struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// Rebuilding reports whether the local replica is still copying its share
// (see above).
func (c *Coordinator) Rebuilding() bool { return c.rebuilding.Load() }

// ClusterFormed pings every peer once and reports whether any of them knows
// the cluster exists (it has seen every node answer, or holds records): a
// node whose directory is empty then lost its disk, and must rebuild. In a
// new cluster no node has seen all the others yet, so nobody waits.
func (c *Coordinator) ClusterFormed() bool {
	if c.formed.Load() {
		return true
	}
	v := c.v()
	for _, p := range v.peers {
		if p == nil {
			continue
		}
		if formed, err := p.client.Ping(v.m.Epoch, time.Now().Add(c.timeout)); err == nil && formed {
			return true
		}
	}
	return false
}

// Formed reports whether this node has seen every other node answer.
func (c *Coordinator) Formed() bool { return c.formed.Load() }

// SetFormed restores what the node knew at its last run, and gives the
// function that records it the first time every peer answers.
func (c *Coordinator) SetFormed(formed bool, record func() error) {
	c.formedMu.Lock()
	defer c.formedMu.Unlock()
	c.formed.Store(formed)
	if formed {
		c.m.formed.Set(1)
	}
	c.recordFormed = record
}

// StartRebuild marks the local replica rebuilding and copies every peer's
// records in the background; then it calls done (the node records that in
// its identity) and serves reads. Close stops it; the next start resumes.
func (c *Coordinator) StartRebuild(done func() error) {
	c.rebuilding.Store(true)
	c.m.rebuilding.Set(1)
	ctx, cancel := context.WithCancel(context.Background())
	c.rebuild = &rebuilder{ctx: ctx, cancel: cancel}
	c.rebuild.done.Add(1)
	go func() {
		defer c.rebuild.done.Done()
		if !c.copyPeers(ctx) {
			return // stopping
		}
		if err := done(); err != nil {
			c.log.Error("rebuild finished but could not be recorded; it runs again at the next start", "err", err)
		}
		c.rebuilding.Store(false)
		c.m.rebuilding.Set(0)
		c.log.Info("rebuild finished: serving reads")
	}()
}

// copyPeers streams every peer's records into the local replica until all
// were copied (true) or ctx ends (false).
func (c *Coordinator) copyPeers(ctx context.Context) bool {
	pending := map[int]bool{}
	for _, i := range c.v().others() {
		pending[i] = true
	}
	c.log.Info("rebuilding: copying this node's share from its peers before serving reads", "peers", len(pending))
	for {
		v := c.v()
		for i := range pending {
			if v.peers[i] == nil { // it left the cluster meanwhile
				delete(pending, i)
				continue
			}
			n, err := c.copyFrom(ctx, v.url(i))
			c.m.rebuildRecords.Add(float64(n))
			if err != nil {
				c.log.Warn("rebuild: copy from a peer failed; trying again", "peer", v.url(i), "copied", n, "err", err)
				continue
			}
			c.log.Info("rebuild: copied a peer's records", "peer", v.url(i), "records", n)
			delete(pending, i)
		}
		if len(pending) == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(rebuildRetry):
		}
	}
}

// copyFrom applies peer i's whole stream to the local replica and returns
// how many records it applied.
func (c *Coordinator) copyFrom(ctx context.Context, url string) (int, error) {
	it, err := c.streams.Open(ctx, url, c.v().m.Epoch, []byte{0}, nil) // "\x00": every non-empty key
	if err != nil {
		return 0, err
	}
	defer it.Close()
	var writes []store.Write
	var recs []record.Record
	var outcomes []replica.Outcome
	applied := 0
	flush := func() error {
		if len(writes) == 0 {
			return nil
		}
		for j := range writes {
			writes[j].Rec = &recs[j] // recs no longer grows: the pointers hold
		}
		// As for any replicated write (replica.ApplyRemote): a version too
		// far ahead of this clock is left out, as a replica refuses it.
		var err error
		if outcomes, err = c.local.ApplyRemote(writes, outcomes); err != nil {
			return err
		}
		for _, o := range outcomes {
			switch {
			case o.Refused != nil:
				c.log.Warn("rebuild: record left out", "peer", url, "err", o.Refused)
			case o.Applied():
				applied++
			}
		}
		writes, recs = writes[:0], recs[:0]
		return nil
	}
	for it.Next() {
		env := bytes.Clone(it.Envelope()) // the stream reuses its buffers
		rec, err := record.Decode(env)
		if err != nil {
			return applied, err
		}
		writes = append(writes, store.Write{Key: bytes.Clone(it.Key())})
		recs = append(recs, rec)
		if len(writes) == rebuildBatch {
			if err := flush(); err != nil {
				return applied, err
			}
		}
	}
	if err := it.Err(); err != nil {
		return applied, fmt.Errorf("stream from %s: %w", url, err)
	}
	return applied, flush()
}

func (r *rebuilder) close() {
	if r == nil {
		return
	}
	r.cancel()
	r.done.Wait()
}
