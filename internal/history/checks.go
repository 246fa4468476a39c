package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// Rule names the promise a violation breaks.
type Rule string

const (
	// A read returned an older write than one acknowledged before the read
	// was called: an acknowledged write was lost, or the read was stale.
	RuleStaleRead Rule = "stale-read"
	// A read returned a write that definitely failed.
	RuleFailedWriteRead Rule = "failed-write-read"
	// A read returned a value that no write of its key wrote.
	RuleUnwrittenValue Rule = "unwritten-value"
	// A read returned a write that was called only after the read returned.
	RuleFutureRead Rule = "future-read"
	// A read returned an older write than a read that returned before it
	// was called.
	RuleNonMonotonicRead Rule = "non-monotonic-read"
	// After healing, a key's final read is missing, or older than the last
	// acknowledged write, or not a write of the key that may have been
	// applied.
	RuleFinalState Rule = "final-state"
	// Replicas hold different bytes for a key, or some lack it.
	RuleReplicaDivergence Rule = "replica-divergence"
	// No linearization of a key's operations exists.
	RuleNotLinearizable Rule = "not-linearizable"
)

// Violation is one broken promise, with the operations that show it: the
// offending read first, then the writes and reads it contradicts (a final
// read is not an Op: its violation holds only the writes; a replica
// divergence holds none).
type Violation struct {
	Rule Rule
	Key  string
	Ops  []Op
	Msg  string // says what is wrong, naming the operations and their times
}

func (v Violation) String() string { return fmt.Sprintf("%s %q: %s", v.Rule, v.Key, v.Msg) }

// CheckReads checks that no acknowledged write is lost and no read is
// stale. For every OK read R of a key, let j be the index of the last write
// of the key acknowledged before R was called (W_j.Return < R.Call; j = 0
// if none). Then:
//
//   - R returned a value: it must be the value of some write W_i of the key
//     (else RuleUnwrittenValue), not a Failed one (RuleFailedWriteRead),
//     called no later than R returned (W_i.Call <= R.Return, else
//     RuleFutureRead), with i >= j (else RuleStaleRead). W_i may be Unknown.
//   - R returned not found: j = 0, or some delete W_d with d >= j, not
//     Failed, called no later than R returned (else RuleStaleRead).
//
// Times compare as closed intervals, as linearizability does: operations
// whose intervals touch are concurrent, so "before" is strict.
func CheckReads(ops []Op) ([]Violation, error) {
	return eachKey(ops, func(km *keyModel) ([]Violation, error) {
		var vs []Violation
		for _, r := range km.reads {
			if v, bad := km.checkRead(r, r.String()); bad {
				vs = append(vs, v)
			}
		}
		return vs, nil
	})
}

// eachKey validates ops and gathers what check finds in each key, in key
// order.
func eachKey(ops []Op, check func(*keyModel) ([]Violation, error)) ([]Violation, error) {
	m, err := build(ops)
	if err != nil {
		return nil, err
	}
	var vs []Violation
	for _, k := range m.order {
		kvs, err := check(m.keys[k])
		if err != nil {
			return nil, err
		}
		vs = append(vs, kvs...)
	}
	return vs, nil
}

// checkRead applies CheckReads's rule to r, named name in the message.
func (km *keyModel) checkRead(r Op, name string) (Violation, bool) {
	j := km.ackedBefore(r.Call)
	v := Violation{Key: km.key, Ops: []Op{r}}
	if r.Found {
		i, ok := km.byValue[r.Value]
		w := Op{}
		if ok {
			w = km.write(i)
			v.Ops = append(v.Ops, w)
		}
		switch {
		case !ok:
			v.Rule, v.Msg = RuleUnwrittenValue, fmt.Sprintf("%s returned a value no write of the key wrote", name)
		case w.Outcome == Failed:
			v.Rule, v.Msg = RuleFailedWriteRead, fmt.Sprintf("%s returned %s, which failed", name, km.describe(i))
		case w.Call > r.Return:
			v.Rule, v.Msg = RuleFutureRead, fmt.Sprintf("%s returned %s, called after the read returned", name, km.describe(i))
		case i < j:
			v.Ops = append(v.Ops, km.write(j))
			v.Rule, v.Msg = RuleStaleRead, fmt.Sprintf("%s returned %s, but %s was acknowledged before the read was called",
				name, km.describe(i), km.describe(j))
		default:
			return Violation{}, false
		}
		return v, true
	}
	if j == 0 || km.deleteFrom(j, r.Return) != 0 {
		return Violation{}, false
	}
	v.Ops = append(v.Ops, km.write(j))
	v.Rule, v.Msg = RuleStaleRead, fmt.Sprintf("%s returned not found, but %s was acknowledged before the read was called, and no delete from then on was called by the time the read returned",
		name, km.describe(j))
	return v, true
}

// CheckMonotonic checks that reads of a key never go back in its issue
// order: if a read R1 returned write i and a read R2 of the same key (from
// any client) was called after R1 returned (R1.Return < R2.Call), R2 must not
// return a write of index < i.
//
// A read that returned not found matches index 0 or the index of any delete
// of the key that is not Failed and was called no later than the read
// returned. The check succeeds iff some choice among these for every such
// read puts every pair of reads in order. It makes the choice greedily, in
// call order: each read gets the smallest index it matches that is at
// least the largest index of the reads that returned before it was called
// and, for a not-found read, at least the index of the last write
// acknowledged before it was called (CheckReads's rule), where one is.
// Any other valid choice is pointwise at least as large, so the greedy one
// fails only where every choice fails: no false alarm, none missed.
//
// A read is reported against the read with the largest index among those
// that returned before it was called. A read of a Failed write counts with
// that write's index (CheckReads reports the read itself); a read of a value
// no write wrote is left out, and to CheckReads.
func CheckMonotonic(ops []Op) ([]Violation, error) {
	return eachKey(ops, (*keyModel).checkMonotonic)
}

func (km *keyModel) checkMonotonic() ([]Violation, error) {
	reads := km.reads // in call order
	byReturn := make([]int, len(reads))
	for n := range byReturn {
		byReturn[n] = n
	}
	slices.SortStableFunc(byReturn, func(a, b int) int { return cmp.Compare(reads[a].Return, reads[b].Return) })
	index := make([]int, len(reads)) // the index chosen for each read, -1 for none
	var vs []Violation
	next, top := 0, -1 // top: the read of largest index among those that returned
	for n, r := range reads {
		// A read that returned before r was called was called before r
		// too, so it already has its index.
		for ; next < len(byReturn) && reads[byReturn[next]].Return < r.Call; next++ {
			if p := byReturn[next]; index[p] >= 0 && (top < 0 || index[p] > index[top]) {
				top = p
			}
		}
		lb := 0
		if top >= 0 {
			lb = index[top]
		}
		if r.Found {
			i, ok := km.byValue[r.Value]
			if !ok {
				index[n] = -1
				continue
			}
			index[n] = i
			if i < lb {
				vs = append(vs, km.monotonicViolation(r, reads[top], km.describe(i), lb))
			}
			continue
		}
		// CheckReads's rule bounds the choice too: a delete at or after
		// the last write acknowledged before r was called (else r is
		// CheckReads's violation, and only lb bounds it here).
		if lo := max(lb, km.ackedBefore(r.Call)); lo > lb {
			if d := km.deleteFrom(lo, r.Return); d != 0 {
				index[n] = d
				continue
			}
		}
		if lb == 0 {
			continue // not found matches the initial state, index 0
		}
		if index[n] = km.deleteFrom(lb, r.Return); index[n] == 0 {
			// No choice works. Any index below lb does as well as another
			// for the reads after this one, whose bound top already sets.
			index[n] = km.lastDeleteBy(r.Return)
			vs = append(vs, km.monotonicViolation(r, reads[top], "not found", lb))
		}
	}
	return vs, nil
}

func (km *keyModel) monotonicViolation(r, prev Op, got string, lb int) Violation {
	return Violation{
		Rule: RuleNonMonotonicRead,
		Key:  km.key,
		Ops:  []Op{r, prev, km.write(lb)},
		Msg: fmt.Sprintf("%v returned %s, older than %s, which %v returned before the read was called",
			r, got, km.describe(lb), prev),
	}
}

// Final is the result of a key's final read.
type Final struct {
	Found bool
	Value string
}

// CheckFinal checks the state the store converged to. final holds, for
// every key, the result of one read made after every operation of ops
// returned and every fault healed (at ack = all replicas, so every replica
// answered). Every key written in ops must have a final read, and the final
// read is checked like a read of CheckReads called after all of ops:
// it must return the last acknowledged write of its key or a later-issued
// one that did not fail (a delete: not found), or, if no write of the key
// was acknowledged, any write that did not fail, or not found. Every
// violation is reported as RuleFinalState.
//
// The final read must also not be older than anything a read of ops
// returned (as CheckMonotonic demands of a read called after them all): a
// write in doubt that a read saw may not be lost either.
func CheckFinal(ops []Op, final map[string]Final) ([]Violation, error) {
	m, err := build(ops)
	if err != nil {
		return nil, err
	}
	for k := range final {
		m.key(k) // a key only read, or never used, must be not found
	}
	slices.Sort(m.order)
	var vs []Violation
	after := time.Duration(math.MaxInt64)
	for _, k := range m.order {
		km := m.keys[k]
		f, ok := final[k]
		if !ok {
			if len(km.writes) > 0 {
				vs = append(vs, Violation{Rule: RuleFinalState, Key: k, Msg: "written, but no final read was given"})
			}
			continue
		}
		r := Op{ID: -1, Client: "final", Kind: Read, Key: k, Found: f.Found, Value: f.Value,
			Call: after, Return: after, Outcome: OK}
		name := "the final read -> not found"
		if f.Found {
			name = fmt.Sprintf("the final read -> %q", f.Value)
		}
		if v, bad := km.checkRead(r, name); bad {
			v.Msg = fmt.Sprintf("%s (%s)", v.Msg, v.Rule)
			v.Rule, v.Ops = RuleFinalState, v.Ops[1:]
			vs = append(vs, v)
			continue
		}
		// Every read of ops returned before the final read: it must not
		// be older than any of them (a write in doubt that a read saw is
		// not lost either).
		km.reads = append(km.reads, r)
		mvs, _ := km.checkMonotonic()
		for _, v := range mvs {
			if v.Ops[0].ID == r.ID && v.Ops[0].Client == r.Client {
				v.Msg = fmt.Sprintf("%s: %s (%s)", name, v.Msg, v.Rule)
				v.Rule, v.Ops = RuleFinalState, v.Ops[1:]
				vs = append(vs, v)
			}
		}
	}
	return vs, nil
}
