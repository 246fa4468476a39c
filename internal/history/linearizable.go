package history

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckLinearizable checks, key by key, that the history is linearizable
// for a last-write-wins register whose versions follow the issue order of
// the key's writes. It is stronger than CheckReads and CheckMonotonic
// together (every violation of theirs makes a key non-linearizable), and
// exponential in the worst case, so it is for small histories: timeout
// bounds the search for each key, and a key whose search runs out of time
// makes it fail with an error rather than guess.
//
// How the history maps onto porcupine's model:
//   - an OK write takes effect once, between its call and its return;
//   - a Failed write, and a read that is not OK, are left out;
//   - an Unknown write may take effect once, at any time after its call,
//     even after later writes: its return is put at infinity. It takes
//     effect only if no later-issued write already has, as under
//     last-write-wins its older version loses; otherwise, or if it never
//     took effect, the register keeps its state;
//   - the register holds the index of the write in effect (0: the initial
//     state) and whether that write is a delete, and a read must return it.
func CheckLinearizable(ops []Op, timeout time.Duration) ([]Violation, error) {
	model := registerModel().ToModel()
	return eachKey(ops, func(km *keyModel) ([]Violation, error) {
		pops := km.porcupineOps()
		// The verbose check explains a failure but costs more: only for one.
		switch porcupine.CheckOperationsTimeout(model, pops, timeout) {
		case porcupine.Illegal:
			_, info := porcupine.CheckOperationsVerbose(model, pops, timeout)
			return []Violation{km.notLinearizable(info)}, nil
		case porcupine.Unknown:
			return nil, fmt.Errorf("history: key %q: linearizability search ran out of its %v", km.key, timeout)
		}
		return nil, nil
	})
}

// notLinearizable reports the key with the longest partial linearization
// porcupine found: the operations after it are where to look.
func (km *keyModel) notLinearizable(info porcupine.LinearizationInfo) Violation {
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	ids := make([]string, len(longest))
	for n, o := range longest {
		ids[n] = fmt.Sprintf("#%d", o.Metadata.(int))
	}
	return Violation{
		Rule: RuleNotLinearizable,
		Key:  km.key,
		Msg: fmt.Sprintf("no linearization of its %d writes and %d OK reads exists; the longest partial linearization found is [%s]",
			len(km.writes), len(km.reads), strings.Join(ids, " ")),
	}
}

// register is the state of one key: the write in effect.
type register struct {
	index   int  // 0: the initial state
	deleted bool // not found
}

// regInput is an operation as porcupine's model sees it.
type regInput struct {
	write  bool
	index  int  // a write's index; a found read's, or -1 for an unwritten value
	found  bool // a read's result
	delete bool // a delete
	maybe  bool // an Unknown write
}

func registerModel() *porcupine.NondeterministicModel {
	return &porcupine.NondeterministicModel{
		Init: func() []any { return []any{register{deleted: true}} },
		Step: func(state, input, _ any) []any {
			s, in := state.(register), input.(regInput)
			if !in.write {
				if in.found == !s.deleted && (!in.found || in.index == s.index) {
					return []any{s}
				}
				return nil
			}
			var next []any
			if in.maybe {
				next = append(next, s) // never took effect, or lost to a newer one
			}
			if s.index < in.index {
				next = append(next, register{index: in.index, deleted: in.delete})
			}
			return next
		},
		DescribeOperation: func(input, _ any) string { return fmt.Sprintf("%+v", input) },
	}
}

// porcupineOps converts the key's operations for porcupine.
func (km *keyModel) porcupineOps() []porcupine.Operation {
	var out []porcupine.Operation
	for n, w := range km.writes {
		if w.Outcome == Failed {
			continue
		}
		ret := int64(w.Return)
		if w.Outcome == Unknown {
			ret = math.MaxInt64
		}
		out = append(out, porcupine.Operation{
			Input: regInput{write: true, index: n + 1, delete: w.Delete, maybe: w.Outcome == Unknown},
			Call:  int64(w.Call), Return: ret, Metadata: w.ID,
		})
	}
	for _, r := range km.reads {
		in := regInput{found: r.Found}
		if r.Found {
			in.index = -1
			if i, ok := km.byValue[r.Value]; ok {
				in.index = i
			}
		}
		out = append(out, porcupine.Operation{Input: in, Call: int64(r.Call), Return: int64(r.Return), Metadata: r.ID})
	}
	return out
}
