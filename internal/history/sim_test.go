package history

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// between returns a random time in [lo, hi], whole milliseconds apart from lo.
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + ms(rng.IntN(int((hi-lo)/time.Millisecond)+1))
}

// simulate makes a history of a last-write-wins store on a few keys. Each
// write that takes effect does so at one instant: an OK write inside its
// interval, an Unknown one inside it, later, or never, a Failed one never;
// the key then holds the largest index in effect so far, as last write wins
// does with versions in issue order. An honest read returns the state at an
// instant inside its interval: such histories break no rule. A faulty store
// also lets some reads (and final reads) return any write at all, or a
// value nobody wrote. Times are whole milliseconds, so intervals often
// touch, which the checks must treat as concurrent.
func simulate(seed uint64, faulty bool) ([]Op, map[string]Final) {
	rng := rand.New(rand.NewPCG(seed, 99))
	var ops []Op
	final := map[string]Final{}
	for k := range 3 {
		key := fmt.Sprintf("k%d", k)
		type effect struct {
			at    time.Duration
			index int
		}
		var writes []Op
		var effects []effect
		t := ms(rng.IntN(10))
		for n := range 2 + rng.IntN(7) {
			w := Op{Client: "w" + key, Kind: Write, Key: key, Call: t, Return: t + ms(1+rng.IntN(20))}
			if rng.IntN(5) == 0 {
				w.Delete = true
			} else {
				w.Value = fmt.Sprintf("v%d", n+1)
			}
			inside := effect{between(rng, w.Call, w.Return), n + 1}
			switch r := rng.IntN(8); {
			case r < 5:
				w.Outcome = OK
				effects = append(effects, inside)
			case r < 6:
				w.Outcome = Failed
			default:
				w.Outcome = Unknown
				switch rng.IntN(3) {
				case 1:
					effects = append(effects, inside)
				case 2:
					effects = append(effects, effect{w.Return + ms(rng.IntN(100)), n + 1})
				}
			}
			writes = append(writes, w)
			t = w.Return + ms(rng.IntN(10))
		}
		state := func(at time.Duration) int {
			best := 0
			for _, e := range effects {
				if e.at <= at && e.index > best {
					best = e.index
				}
			}
			return best
		}
		result := func(i int) (bool, string) {
			if i == 0 || writes[i-1].Delete {
				return false, ""
			}
			return true, writes[i-1].Value
		}
		horizon := int((t + ms(50)) / time.Millisecond)
		for range 4 + rng.IntN(12) {
			r := Op{Client: fmt.Sprintf("r%d", rng.IntN(3)), Kind: Read, Key: key, Outcome: OK, Call: ms(rng.IntN(horizon))}
			r.Return = r.Call + ms(rng.IntN(30))
			i := state(between(rng, r.Call, r.Return))
			if faulty && rng.IntN(4) == 0 {
				i = rng.IntN(len(writes) + 1)
			}
			r.Found, r.Value = result(i)
			switch {
			case faulty && rng.IntN(30) == 0:
				r.Found, r.Value = true, "ghost"
			case rng.IntN(10) == 0:
				r.Outcome, r.Found, r.Value = Unknown, false, ""
			}
			ops = append(ops, r)
		}
		ops = append(ops, writes...)
		i := state(math.MaxInt64)
		if faulty && rng.IntN(4) == 0 {
			i = rng.IntN(len(writes) + 1)
		}
		found, v := result(i)
		final[key] = Final{Found: found, Value: v}
	}
	slices.SortStableFunc(ops, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	for n := range ops {
		ops[n].ID = n
	}
	return ops, final
}

func dump(ops []Op) string {
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintln(&b, o)
	}
	return b.String()
}

// TestHonestStoresPass checks that no check raises a false alarm on
// histories of a correct last-write-wins store.
func TestHonestStoresPass(t *testing.T) {
	t.Parallel()
	for seed := range uint64(300) {
		ops, final := simulate(seed, false)
		for name, check := range map[string]func() ([]Violation, error){
			"reads":        func() ([]Violation, error) { return CheckReads(ops) },
			"monotonic":    func() ([]Violation, error) { return CheckMonotonic(ops) },
			"final":        func() ([]Violation, error) { return CheckFinal(ops, final) },
			"linearizable": func() ([]Violation, error) { return CheckLinearizable(ops, 10*time.Second) },
		} {
			vs, err := check()
			require.NoError(t, err, "seed %d", seed)
			if len(vs) > 0 {
				t.Fatalf("seed %d, %s: %v\nhistory:\n%s", seed, name, vs, dump(ops))
			}
		}
	}
}

// TestFaultyStoresAgreeWithExhaustiveSearch checks the rules against two
// exhaustive searches on histories of a store that returns wrong values:
// porcupine must find every key that CheckReads or CheckMonotonic flags
// non-linearizable (the rules follow from linearizability, so a flag it
// does not confirm is a false alarm), and CheckMonotonic must flag a key
// exactly when no choice of index for its not-found reads orders them all
// (the greedy choice neither misses a violation nor invents one).
func TestFaultyStoresAgreeWithExhaustiveSearch(t *testing.T) {
	t.Parallel()
	var flagged, searched int
	for seed := range uint64(200) {
		ops, _ := simulate(seed, true)
		reads, err := CheckReads(ops)
		require.NoError(t, err)
		mono, err := CheckMonotonic(ops)
		require.NoError(t, err)
		lin, err := CheckLinearizable(ops, 10*time.Second)
		require.NoError(t, err)
		if v, bad := unconfirmed(append(reads, mono...), lin); bad {
			t.Fatalf("seed %d: %v, yet porcupine finds the key linearizable\nhistory:\n%s", seed, v, dump(ops))
		}
		flagged += len(reads) + len(mono)

		m, err := build(ops)
		require.NoError(t, err)
		for _, k := range m.order {
			ordered, ok := m.keys[k].monotonicByBruteForce()
			if !ok {
				continue
			}
			searched++
			flaggedKey := slices.ContainsFunc(mono, func(v Violation) bool { return v.Key == k })
			if ordered == flaggedKey {
				t.Fatalf("seed %d, key %s: exhaustive search orders the reads: %v; CheckMonotonic flags: %v\nhistory:\n%s",
					seed, k, ordered, flaggedKey, dump(ops))
			}
		}
	}
	t.Logf("%d violations, %d keys searched exhaustively", flagged, searched)
	require.Greater(t, flagged, 100, "the faulty store must break the rules often")
	require.Greater(t, searched, 300)
}

// monotonicByBruteForce tries every choice of index for the key's
// not-found reads and reports whether one puts every pair of reads in
// real-time order; ok is false when there are too many choices to try.
func (km *keyModel) monotonicByBruteForce() (ordered, ok bool) {
	type read struct {
		op    Op
		cands []int
	}
	var reads []read
	choices := 1
	for _, r := range km.reads {
		var cands []int
		switch i, known := km.byValue[r.Value]; {
		case r.Found && !known:
			continue // left to CheckReads
		case r.Found:
			cands = []int{i}
		default:
			// CheckReads's rule: index 0 only if no write was acknowledged
			// before r, else a delete from then on; where none is left
			// (CheckReads flags r), any of them.
			j := km.ackedBefore(r.Call)
			var all []int
			if j == 0 {
				cands = []int{0}
			}
			all = []int{0}
			for _, d := range km.deletes {
				if km.write(d).Call <= r.Return {
					all = append(all, d)
					if d >= j {
						cands = append(cands, d)
					}
				}
			}
			if len(cands) == 0 {
				cands = all
			}
		}
		reads = append(reads, read{r, cands})
		if choices *= len(cands); choices > 100_000 {
			return false, false
		}
	}
	index := make([]int, len(reads))
	var try func(n int) bool
	try = func(n int) bool {
		if n == len(reads) {
			for a := range reads {
				for b := range reads {
					if reads[a].op.Return < reads[b].op.Call && index[a] > index[b] {
						return false
					}
				}
			}
			return true
		}
		for _, c := range reads[n].cands {
			index[n] = c
			if try(n + 1) {
				return true
			}
		}
		return false
	}
	return try(0), true
}
