package history

// Mutation tests of the checker (review): hand-built histories holding
// each anomaly the checks claim to catch, and legal ones they must accept.

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// h builds a history from ops, numbering them in order.
func h(ops ...Op) []Op {
	for n := range ops {
		ops[n].ID = n
	}
	return ops
}

func wr(c, k, v string, call, ret int, out Outcome) Op {
	return Op{Client: c, Kind: Write, Key: k, Value: v, Call: ms(call), Return: ms(ret), Outcome: out}
}

func del(c, k string, call, ret int, out Outcome) Op {
	return Op{Client: c, Kind: Write, Key: k, Delete: true, Call: ms(call), Return: ms(ret), Outcome: out}
}

func rd(c, k, v string, call, ret int) Op {
	return Op{Client: c, Kind: Read, Key: k, Found: true, Value: v, Call: ms(call), Return: ms(ret), Outcome: OK}
}

func nf(c, k string, call, ret int) Op {
	return Op{Client: c, Kind: Read, Key: k, Call: ms(call), Return: ms(ret), Outcome: OK}
}

func rules(vs []Violation) []Rule {
	var out []Rule
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

// all runs CheckReads and CheckMonotonic (what the e2e tests run) and
// CheckLinearizable (the oracle).
func all(t *testing.T, ops []Op) (reads, mono, lin []Rule) {
	t.Helper()
	r, err := CheckReads(ops)
	require.NoError(t, err)
	m, err := CheckMonotonic(ops)
	require.NoError(t, err)
	l, err := CheckLinearizable(ops, 10*time.Second)
	require.NoError(t, err)
	return rules(r), rules(m), rules(l)
}

// TestAnomaliesFlagged: each anomaly the package documents is caught
// by the check that claims it (and porcupine agrees).
func TestAnomaliesFlagged(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ops       []Op
		reads     []Rule
		mono      []Rule
		finalLost bool
	}{
		{"lost acknowledged write (stale read)", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, OK), rd("r", "k", "v1", 40, 50)),
			[]Rule{RuleStaleRead}, nil, false},
		{"not found after an acknowledged write", h(
			wr("w", "k", "v1", 0, 10, OK), nf("r", "k", 40, 50)),
			[]Rule{RuleStaleRead}, nil, false},
		{"non-monotonic pair of reads", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 100, OK),
			rd("r1", "k", "v2", 30, 40), rd("r2", "k", "v1", 50, 60)),
			nil, []Rule{RuleNonMonotonicRead}, false},
		{"value never written", h(
			wr("w", "k", "v1", 0, 10, OK), rd("r", "k", "zzz", 40, 50)),
			[]Rule{RuleUnwrittenValue}, nil, false},
		{"old value after an acknowledged delete", h(
			wr("w", "k", "v1", 0, 10, OK), del("w", "k", 20, 30, OK), rd("r", "k", "v1", 40, 50)),
			[]Rule{RuleStaleRead}, nil, false},
		{"failed write read", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, Failed), rd("r", "k", "v2", 25, 50)),
			[]Rule{RuleFailedWriteRead}, nil, false},
		{"unknown write read after a later acknowledged one", h(
			wr("w", "k", "v1", 0, 10, Unknown), wr("w", "k", "v2", 20, 30, OK), rd("r", "k", "v1", 40, 50)),
			[]Rule{RuleStaleRead}, nil, false},
		{"read of a write called after the read returned", h(
			rd("r", "k", "v1", 0, 5), wr("w", "k", "v1", 6, 10, OK)),
			[]Rule{RuleFutureRead}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, m, l := all(t, tc.ops)
			require.Equal(t, tc.reads, r, "CheckReads")
			require.Equal(t, tc.mono, m, "CheckMonotonic")
			require.Equal(t, []Rule{RuleNotLinearizable}, l, "porcupine")
		})
	}
}

// TestLegalAccepted: legal histories pass every check.
func TestLegalAccepted(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Op
	}{
		{"unknown write visible later", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, Unknown),
			rd("r", "k", "v1", 40, 50), rd("r", "k", "v2", 60, 70), rd("r", "k", "v2", 80, 90))},
		{"unknown write never visible", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, Unknown),
			rd("r", "k", "v1", 40, 50), rd("r", "k", "v1", 60, 70))},
		{"acknowledged after an unknown one", h(
			wr("w", "k", "v1", 0, 10, Unknown), wr("w", "k", "v2", 20, 30, OK),
			rd("r", "k", "v1", 15, 25), rd("r2", "k", "v2", 26, 35), rd("r", "k", "v2", 40, 50))},
		{"read concurrent with a write: old", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, OK), rd("r", "k", "v1", 25, 35))},
		{"read concurrent with a write: new", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 20, 30, OK), rd("r", "k", "v2", 25, 35))},
		{"equal timestamps are concurrent", h(
			wr("w", "k", "v1", 0, 10, OK), wr("w", "k", "v2", 10, 20, OK), rd("r", "k", "v1", 20, 20),
			rd("r2", "k", "v2", 20, 20))},
		{"not found concurrent with a delete, then not found", h(
			wr("w", "k", "v1", 0, 10, OK), del("w", "k", 20, 30, OK), nf("r", "k", 25, 26), nf("r", "k", 40, 41))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, m, l := all(t, tc.ops)
			require.Empty(t, r)
			require.Empty(t, m)
			require.Empty(t, l)
		})
	}
	// many writes: every read returns the last acknowledged one.
	var ops []Op
	for n := range 200 {
		ops = append(ops, wr("w", "k", "v"+string(rune('a'+n%26))+string(rune('a'+n/26)), 100*n, 100*n+10, OK),
			rd("r", "k", "v"+string(rune('a'+n%26))+string(rune('a'+n/26)), 100*n+20, 100*n+30))
	}
	r, m, _ := all(t, h(ops...))
	require.Empty(t, r)
	require.Empty(t, m)
	ops[len(ops)-1].Value = ops[len(ops)-5].Value
	r, m, _ = all(t, h(ops...))
	require.Equal(t, []Rule{RuleStaleRead}, r)
	require.Equal(t, []Rule{RuleNonMonotonicRead}, m)
}

// TestReplicasDiffer: CheckReplicas flags different bytes and a
// missing copy, and accepts identical ones.
func TestReplicasDiffer(t *testing.T) {
	same := map[string]map[string][]byte{"a": {"k": []byte("x")}, "b": {"k": []byte("x")}}
	require.Empty(t, CheckReplicas(same))
	diff := map[string]map[string][]byte{"a": {"k": []byte("x")}, "b": {"k": []byte("y")}}
	require.Equal(t, []Rule{RuleReplicaDivergence}, rules(CheckReplicas(diff)))
	miss := map[string]map[string][]byte{"a": {"k": []byte("x")}, "b": {}}
	require.Equal(t, []Rule{RuleReplicaDivergence}, rules(CheckReplicas(miss)))
}

// TestNotFoundThenOlderValue: a read R1 called after v2 was
// acknowledged returns not found, which only the delete still in flight
// (or in doubt) explains; a read R2 called after R1 returned then returns
// v2, older than that delete. Porcupine finds no linearization, and the
// read went back in time, but neither CheckReads nor CheckMonotonic
// flagged it: the greedy choice gave R1 index 0 (the initial state),
// which CheckReads's own rule (index >= 2, the write acknowledged before
// R1) already excludes.
func TestNotFoundThenOlderValue(t *testing.T) {
	for _, out := range []Outcome{OK, Unknown} {
		t.Run(string(out), func(t *testing.T) {
			ops := h(
				wr("w", "k", "v1", 0, 10, OK),
				wr("w", "k", "v2", 20, 30, OK),
				del("w", "k", 40, 100, out),
				nf("r1", "k", 60, 70),
				rd("r2", "k", "v2", 80, 90),
			)
			r, m, l := all(t, ops)
			require.Equal(t, []Rule{RuleNotLinearizable}, l, "porcupine")
			require.Empty(t, r)
			require.Equal(t, []Rule{RuleNonMonotonicRead}, m, "R2 returned v2 after R1 returned not found")
		})
	}
}

// TestFinalOlderThanARead: the writer's last write v2 is in doubt
// (a 504), a quorum read returns it, and after healing and anti-entropy
// every replica holds v1: the write a read saw is lost. CheckFinal, as the
// e2e tests call it (the final reads not recorded in the history: faults_test
// killUnderLoad, membership_faults_test faultRun.check, membership_test
// checkAfterChange), accepted it.
func TestFinalOlderThanARead(t *testing.T) {
	ops := h(
		wr("w", "k", "v1", 0, 10, OK),
		wr("w", "k", "v2", 20, 30, Unknown),
		rd("r", "k", "v2", 40, 50),
	)
	vs, err := CheckFinal(ops, map[string]Final{"k": {Found: true, Value: "v1"}})
	require.NoError(t, err)
	require.Equal(t, []Rule{RuleFinalState}, rules(vs), "the final state is older than what a read returned")
	// Not found at the end after a read returned v2, with no delete: lost too.
	vs, err = CheckFinal(ops, map[string]Final{"k": {}})
	require.NoError(t, err)
	require.Equal(t, []Rule{RuleFinalState}, rules(vs))
	// The final state may be v2.
	vs, err = CheckFinal(ops, map[string]Final{"k": {Found: true, Value: "v2"}})
	require.NoError(t, err)
	require.Empty(t, vs)
}

// TestRecorderSameInstantInBubble: in a synctest bubble (the
// in-memory fault tests: membership_faults_test, clockskew_test) a request
// takes no time on the clock, so the recorder stamped a write's return and
// a later read's call with the same instant; the checker then treated them
// as concurrent, and a read that began after the write was acknowledged
// returned the old value unflagged. Stamps are now strictly increasing,
// taken under the recorder's lock in the order things happened.
func TestRecorderSameInstantInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := NewRecorder()
		rec.Write("w", "k", "v1").OK()
		time.Sleep(time.Millisecond)
		rec.Write("w", "k", "v2").OK() // acknowledged...
		rec.Read("r", "k").Found("v1") // ...then a read called after it returns v1
		rec.Read("r2", "k").Found("v2")
		rec.Read("r3", "k").Found("v1") // and back again
		ops := rec.History().Ops
		r, m, _ := all(t, ops)
		require.Equal(t, []Rule{RuleStaleRead, RuleStaleRead}, r, "%s", dump(ops))
		require.Equal(t, []Rule{RuleNonMonotonicRead}, m, "%s", dump(ops))
	})
}

// TestHistoryWhileOperationsStart: History took "now" before the lock,
// so an operation announced between the two was included as pending with
// a return before its call, and every check then refused the history.
func TestHistoryWhileOperationsStart(t *testing.T) {
	rec := NewRecorder()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				rec.Read(string(rune('a'+c)), "k").NotFound()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		for _, o := range rec.History().Ops {
			require.GreaterOrEqual(t, o.Return, o.Call, "%v", o)
		}
		rec.mu.Lock()
		rec.done = rec.done[:0] // keep each History small
		rec.mu.Unlock()
	}
}
