package replica

import (
	"fmt"

	"github.com/dhtkv/dhtkv/internal/store"
)

// Outcome is what ApplyRemote did with one write.
type Outcome struct {
	// Newer is the version that kept the write out: the key's newer
	// version here, or its partition's garbage-collection horizon for a
	// write below it of a key that holds nothing (as if the key held
	// something newer, which it may have had before a collection). 0 when
	// it is not the reason.
	Newer uint64
	// Refused says why the write's version was refused: it is too far
	// ahead of this node's clock (hlc.ErrTooFarAhead). nil when it is not
	// the reason.
	Refused error
}

// Applied reports whether the write was stored.
func (o Outcome) Applied() bool { return o.Newer == 0 && o.Refused == nil }

// Versions made elsewhere
//
// A version another node made reaches this node's clock by this file
// only, under one rule: a version more than the clock's bound
// (--max-clock-skew) ahead of this node's wall clock is refused and never
// observed (hlc.Clock.CheckAhead), so no path drags this clock, and every
// version this node makes later, ahead. The paths, all of them:
//
//   - stored, by ApplyRemote: a coordinator's batch (rpc.Server), a read
//     repair of the local replica and an anti-entropy pull
//     (cluster.Coordinator.ApplyRemote), a hint delivered here and an
//     anti-entropy push from a peer (both a batch), a partition copy
//     (partcopy: a membership change's stream or a rebuild's) and the
//     comparison after a change's stream (an anti-entropy pull);
//   - seen and not stored, by Observe: a replica's answer to a read this
//     node coordinates, and the newer version a replica refused one of its
//     writes with. Record streams (cluster scans, partition copies)
//     carry versions to clients or to ApplyRemote and observe nothing.
//
// A refusal leaves this node's clock where it was: the record stays
// where it is (on the node that made it, or its coordinator's hints),
// and is refused again until this clock is within the bound of it.

// Observe advances this node's clock past v, a version another node made
// that this node does not store (see above): ordering this node's later
// writes after it. A version beyond the bound is refused
// (hlc.ErrTooFarAhead) and not observed.
func (r *Replica) Observe(v uint64) error { return r.Clock.Observe(v) }

// ApplyRemote stores records whose versions another node made: a batch
// from a coordinator, a read repair, an anti-entropy pull, a partition
// copy. It is the one path by which such a record is stored, and it holds
// these rules, in this order:
//
//  1. a version more than the clock's bound ahead of this node's wall
//     clock is refused, that write alone (Outcome.Refused): observing it
//     would drag this node's clock, and every version it makes later, up
//     to it;
//  2. the clock observes the highest version kept before anything is
//     stored, so that no version this node makes later (after a restart
//     too) is below one it stored;
//  3. a write older than what the key holds, or below its partition's
//     horizon where the key holds nothing, is not applied
//     (Outcome.Newer): last-write-wins, and a write older than a
//     collected delete cannot bring the key back; the same version again
//     is the same write, and is applied;
//  4. the rest go to the store in one commit (one fsync).
//
// An error fails every write not yet refused or kept out: none of them
// was stored. ApplyRemote writes one Outcome per write into out (reused)
// and returns it; it may overwrite ws. A caller routing by a cluster map
// calls it under that map's gate (membership's install), so that no
// record routed by an older map is stored once a newer one is installed.
func (r *Replica) ApplyRemote(ws []store.Write, out []Outcome) ([]Outcome, error) {
	out = out[:0]
	var highest uint64
	for _, w := range ws {
		var o Outcome
		if err := r.Clock.CheckAhead(w.Rec.Version); err != nil {
			o.Refused = err
		} else {
			highest = max(highest, w.Rec.Version)
		}
		out = append(out, o)
	}
	if highest == 0 {
		return out, nil
	}
	if err := r.Clock.Observe(highest); err != nil {
		return out, fmt.Errorf("replica apply remote: %w", err)
	}
	keep := ws[:0]
	for i, w := range ws {
		if out[i].Refused != nil {
			continue
		}
		newer, err := r.NewerVersion(w.Key, w.Rec.Version)
		if err != nil {
			return out, err
		}
		if newer != 0 {
			out[i].Newer = newer
			continue
		}
		keep = append(keep, w)
	}
	if len(keep) == 0 {
		return out, nil
	}
	return out, r.ApplyBatch(keep)
}
