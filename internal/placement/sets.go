package placement

import (
	"slices"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
)

// Sets is the placement of one cluster map: the replica sets before and
// after the change under way (the same placement when none is), and which
// of them requests use at the map's stage (clustermap.Stage).
//
// Invariant: while a change is under way a write must reach ack replicas of
// both sets, and a read asks the old set until the stage read-new; so a
// read always meets a replica that took every acknowledged write.
//
// Each set has its own replication factor (OldFactor, NewFactor): they
// differ during a replicas change (clustermap.Replicas), where the new set
// is the same nodes with the new factor. Every question about a set (its
// replicas of a partition, what a node holds, receives or gains) is
// answered with that set's factor, and a request's from is cut to it:
// asking a set for more replicas than its factor would send writes to, and
// read from, nodes that do not hold the partition.
type Sets struct {
	// Old places partitions before the change under way, New after it.
	Old, New *Placement
	// Moving: a change is under way, and writes go to both sets.
	Moving bool
	// ReadNew: the change reached read-new, and reads use the new set.
	ReadNew bool
	// OldFactor and NewFactor are the sets' replication factors, each at
	// most its set's size: the map's Replicas and NewReplicas.
	OldFactor, NewFactor int
	// Replicas is the largest from a request may ask, and the largest ack
	// a write may ask: the larger factor. Each set is asked for at most
	// its own factor of replicas, and a write needs ack of each set, or
	// every replica of a set smaller than ack (cluster.fanOut): so a write
	// at the default ack, a majority of the larger factor, holds a
	// majority of each set, which a read at the default ack of the set it
	// reads always meets. A read may ask up to the factor of the set it
	// reads (ReadFactor).
	Replicas int
}

// Of derives the sets of m.
func Of(m *clustermap.Map) *Sets {
	s := &Sets{Old: New(m.Old()), New: New(m.New())}
	if ch := m.Change; ch != nil {
		s.Moving = true
		s.ReadNew = ch.Stage == clustermap.ReadNew
	}
	s.OldFactor = min(m.Replicas, s.Old.Size())
	s.NewFactor = min(m.NewReplicas(), s.New.Size())
	s.Replicas = max(s.OldFactor, s.NewFactor)
	return s
}

// ReadFactor is the replication factor of the set reads use at the map's
// stage.
func (s *Sets) ReadFactor() int {
	if s.ReadNew {
		return s.NewFactor
	}
	return s.OldFactor
}

// ReadReplicas appends the ids of the first from replicas of key that a
// read asks (at most the set's factor): the old set's until the change
// under way reaches read-new.
func (s *Sets) ReadReplicas(key []byte, from int, dst []int) []int {
	if s.ReadNew {
		return s.New.Replicas(key, min(from, s.NewFactor), dst)
	}
	return s.Old.Replicas(key, min(from, s.OldFactor), dst)
}

// WriteSets returns the first from replicas of key (at most each set's
// factor) in the old set and, while a change is under way, in the new set
// (nil otherwise). A write must reach ack replicas of each.
func (s *Sets) WriteSets(key []byte, from int, oldBuf, newBuf []int) (old, new []int) {
	old = s.Old.Replicas(key, min(from, s.OldFactor), oldBuf)
	if s.Moving {
		new = s.New.Replicas(key, min(from, s.NewFactor), newBuf)
	}
	return old, new
}

// maxSet bounds the on-stack replica lists of the loops below; larger
// replication factors allocate.
const maxSet = 8

// Holds reports whether node is a replica of part in the old set: what a
// node keeps once the change under way (if any) is over is the new set,
// which a map that has no change any more calls old.
func (s *Sets) Holds(part partition.ID, node int) bool {
	var buf [maxSet]int
	return slices.Contains(s.Old.PartitionReplicas(part, s.OldFactor, buf[:0]), node)
}

// Receives reports whether node is a replica of part in the old set or,
// while a change is under way, in the new set: whether a write of the
// partition is sent to it now. A node that receives none holds none of
// the partition once the change under way (if any) is over, so nothing
// may be written to it any more (a late hint would be kept outside its
// partitions, never updated again).
func (s *Sets) Receives(part partition.ID, node int) bool {
	var buf [maxSet]int
	if slices.Contains(s.Old.PartitionReplicas(part, s.OldFactor, buf[:0]), node) {
		return true
	}
	return s.Moving && slices.Contains(s.New.PartitionReplicas(part, s.NewFactor, buf[:0]), node)
}

// OldReplicas appends the ids of part's replicas in the old set to dst.
func (s *Sets) OldReplicas(part partition.ID, dst []int) []int {
	return s.Old.PartitionReplicas(part, s.OldFactor, dst)
}

// Shared returns the partitions of which both nodes a and b are replicas,
// in the old or the new set: what anti-entropy between them compares.
func (s *Sets) Shared(a, b int) []partition.ID {
	var out []partition.ID
	var oldBuf, newBuf [maxSet]int
	for p := range partition.Count {
		old := s.Old.PartitionReplicas(partition.ID(p), s.OldFactor, oldBuf[:0])
		new := s.New.PartitionReplicas(partition.ID(p), s.NewFactor, newBuf[:0])
		has := func(n int) bool { return slices.Contains(old, n) || slices.Contains(new, n) }
		if has(a) && has(b) {
			out = append(out, partition.ID(p))
		}
	}
	return out
}

// Compared returns the partitions that anti-entropy between nodes a and
// b compares: those both replicate in the old set and, once the change
// under way reached read-new, in the new set too. Before read-new a
// node's gained partitions are the change's to copy (membership streams
// them and compares them with every old replica, Gains); an exchange
// beside that copy would pull and push the same records again at the
// gaining node's expense, and no read asks that node before read-new.
// Without a change under way it is Shared.
func (s *Sets) Compared(a, b int) []partition.ID {
	if !s.Moving || s.ReadNew {
		return s.Shared(a, b)
	}
	var out []partition.ID
	var buf [maxSet]int
	for p := range partition.Count {
		old := s.Old.PartitionReplicas(partition.ID(p), s.OldFactor, buf[:0])
		if slices.Contains(old, a) && slices.Contains(old, b) {
			out = append(out, partition.ID(p))
		}
	}
	return out
}

// Gains returns, by old replica, the partitions that node gains in the
// change (in its new set, not in its old): each must be copied from every
// old replica, since a write acknowledged before the change may be on ack
// of them only.
func (s *Sets) Gains(node int) map[int][]partition.ID {
	out := map[int][]partition.ID{}
	var oldBuf, newBuf [maxSet]int
	for p := range partition.Count {
		part := partition.ID(p)
		old := s.Old.PartitionReplicas(part, s.OldFactor, oldBuf[:0])
		new := s.New.PartitionReplicas(part, s.NewFactor, newBuf[:0])
		if !slices.Contains(new, node) || slices.Contains(old, node) {
			continue
		}
		for _, r := range old {
			out[r] = append(out[r], part)
		}
	}
	return out
}

// Gainers returns the nodes that gain partitions in the change, sorted.
func (s *Sets) Gainers() []int {
	var out []int
	var oldBuf, newBuf [maxSet]int
	seen := map[int]bool{}
	for p := range partition.Count {
		old := s.Old.PartitionReplicas(partition.ID(p), s.OldFactor, oldBuf[:0])
		for _, n := range s.New.PartitionReplicas(partition.ID(p), s.NewFactor, newBuf[:0]) {
			if !seen[n] && !slices.Contains(old, n) {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}
