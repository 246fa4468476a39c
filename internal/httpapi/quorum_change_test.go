package httpapi

import (
	"fmt"
	"slices"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/placement"
)

// subsets calls fn with every subset of xs of size k.
func subsets(xs []int, k int, fn func([]int) bool) bool {
	var rec func(start int, cur []int) bool
	rec = func(start int, cur []int) bool {
		if len(cur) == k {
			return fn(cur)
		}
		for i := start; i < len(xs); i++ {
			if rec(i+1, append(cur, xs[i])) {
				return true
			}
		}
		return false
	}
	return rec(0, nil)
}

// TestDefaultQuorumsMeetDuringReplicasChange: with the default ack and
// from (parseReplication over Coordinator.Factors: Sets.Replicas for a
// write, Sets.ReadFactor for a read), a write acknowledged by ack
// replicas of each set (or all of a set smaller than ack) and a read
// answered by ack replicas of the set it reads share a replica, at every
// stage of every replicas change. A write's ack was bounded by the
// smaller factor, so from 3 to 1 a write acknowledged by the one new
// replica alone, which is a replica of the old set too, was missed by a
// read of two other old replicas.
func TestDefaultQuorumsMeetDuringReplicasChange(t *testing.T) {
	for _, tc := range []struct{ nodes, from, to int }{{2, 2, 1}, {2, 1, 2}, {4, 2, 3}, {3, 3, 1}, {3, 1, 3}, {5, 5, 2}, {5, 2, 5}} {
		var urls []string
		for i := range tc.nodes {
			urls = append(urls, fmt.Sprintf("http://n%d:1", i))
		}
		m, err := clustermap.Seed(urls, tc.from)
		if err != nil {
			t.Fatal(err)
		}
		if m, err = m.BeginReplicas(tc.to, 0); err != nil {
			t.Fatal(err)
		}
		for ; m.Change != nil; m, _ = m.Advance() {
			s := placement.Of(m)
			var args fasthttp.Args
			wAck, from, aerr := parseReplication(&args, s.Replicas, s.Replicas)
			if aerr != nil {
				t.Fatal(aerr)
			}
			rAck, rFrom, aerr := parseReplication(&args, s.Replicas, s.ReadFactor())
			if aerr != nil {
				t.Fatal(aerr)
			}
			for p := range partition.Count {
				part := partition.ID(p)
				// As Sets.WriteSets and Sets.ReadReplicas, by partition.
				old := s.Old.PartitionReplicas(part, min(from, s.OldFactor), nil)
				var nw []int
				if s.Moving {
					nw = s.New.PartitionReplicas(part, min(from, s.NewFactor), nil)
				}
				readSet := s.Old.PartitionReplicas(part, min(rFrom, s.OldFactor), nil)
				if s.ReadNew {
					readSet = s.New.PartitionReplicas(part, min(rFrom, s.NewFactor), nil)
				}
				// The write is acknowledged by wAck of old and wAck of new, or
				// all of a smaller set: any such pair of subsets (the others
				// may never get it).
				miss := subsets(old, min(wAck, len(old)), func(wo []int) bool {
					return subsets(nw, min(wAck, len(nw)), func(wn []int) bool {
						acked := append(slices.Clone(wo), wn...)
						return subsets(readSet, rAck, func(r []int) bool {
							for _, n := range r {
								if slices.Contains(acked, n) {
									return false
								}
							}
							t.Errorf("replicas %d->%d on %d nodes, stage %s, partition %d: write ack=%d acknowledged by %v only (old %v, new %v); read ack=%d of %v answered by %v: misses it",
								tc.from, tc.to, tc.nodes, m.Change.Stage, part, wAck, acked, old, nw, rAck, readSet, r)
							return true
						})
					})
				})
				if miss {
					break
				}
			}
		}
	}
}
