package history

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// keyModel is one key's side of a history: its writes in issue order, so
// that write index i (1-based) is writes[i-1], and its OK reads.
type keyModel struct {
	key     string
	writes  []Op
	byValue map[string]int // a put's value -> its index
	acked   []int          // indices of OK writes, ascending (so are their returns)
	deletes []int          // indices of deletes not Failed, ascending (so are their calls)
	reads   []Op           // OK reads, in call order
}

// model is a validated history, by key.
type model struct {
	keys  map[string]*keyModel
	order []string // keys sorted, for a stable report
}

// build validates ops against the package's model and indexes them by key.
// It fails, rather than report violations, when the history breaks the
// model's assumptions, since then no check's verdict would mean anything:
// two clients writing one key, overlapping writes of a key, a value written
// twice, or a malformed operation.
func build(ops []Op) (*model, error) {
	m := &model{keys: make(map[string]*keyModel)}
	ids := make(map[int]bool, len(ops))
	for _, o := range ops {
		if ids[o.ID] {
			return nil, fmt.Errorf("history: op id %d used twice", o.ID)
		}
		ids[o.ID] = true
		if err := validOp(o); err != nil {
			return nil, fmt.Errorf("history: %v: %w", o, err)
		}
		km := m.key(o.Key)
		switch {
		case o.Kind == Write:
			km.writes = append(km.writes, o)
		case o.Outcome == OK:
			km.reads = append(km.reads, o)
		}
	}
	slices.Sort(m.order)
	for _, k := range m.order {
		if err := m.keys[k].index(); err != nil {
			return nil, fmt.Errorf("history: key %q: %w", k, err)
		}
	}
	return m, nil
}

func (m *model) key(k string) *keyModel {
	km, ok := m.keys[k]
	if !ok {
		km = &keyModel{key: k, byValue: make(map[string]int)}
		m.keys[k] = km
		m.order = append(m.order, k)
	}
	return km
}

func validOp(o Op) error {
	switch {
	case o.Kind != Write && o.Kind != Read:
		return fmt.Errorf("kind %q is neither %q nor %q", o.Kind, Write, Read)
	case o.Outcome != OK && o.Outcome != Failed && o.Outcome != Unknown:
		return fmt.Errorf("outcome %q is not one of %q, %q, %q", o.Outcome, OK, Failed, Unknown)
	case o.Return < o.Call:
		return fmt.Errorf("returns before it is called")
	case o.Kind == Write && o.Found:
		return fmt.Errorf("a write with a read's result")
	case o.Kind == Write && o.Delete && o.Value != "":
		return fmt.Errorf("a delete with a value")
	case o.Kind == Read && o.Delete:
		return fmt.Errorf("a read marked as a delete")
	case o.Kind == Read && !(o.Outcome == OK && o.Found) && (o.Found || o.Value != ""):
		return fmt.Errorf("a value for a read that returned none")
	}
	return nil
}

// index orders the key's writes by call time and checks that one client
// issued them one at a time, each after the previous returned.
func (km *keyModel) index() error {
	slices.SortStableFunc(km.writes, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	slices.SortStableFunc(km.reads, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	for n, w := range km.writes {
		i := n + 1
		if n > 0 {
			prev := km.writes[n-1]
			if w.Client != prev.Client {
				return fmt.Errorf("written by two clients: %v and %v", prev, w)
			}
			if w.Call <= prev.Call || w.Call < prev.Return {
				return fmt.Errorf("overlapping writes: %v and %v", prev, w)
			}
		}
		if !w.Delete {
			if j, dup := km.byValue[w.Value]; dup {
				return fmt.Errorf("value written twice: %v and %v", km.write(j), w)
			}
			km.byValue[w.Value] = i
		}
		if w.Outcome == OK {
			km.acked = append(km.acked, i)
		}
		if w.Delete && w.Outcome != Failed {
			km.deletes = append(km.deletes, i)
		}
	}
	return nil
}

// write returns the write of index i >= 1.
func (km *keyModel) write(i int) Op { return km.writes[i-1] }

// ackedBefore returns the index of the last write acknowledged strictly
// before t, or 0. Writes are sequential, so the returns of acknowledged
// writes ascend with their indices.
func (km *keyModel) ackedBefore(t time.Duration) int {
	n := sort.Search(len(km.acked), func(n int) bool { return km.write(km.acked[n]).Return >= t })
	if n == 0 {
		return 0
	}
	return km.acked[n-1]
}

// deleteFrom returns the smallest index >= lo of a delete, not Failed,
// called no later than by (a read that returned at by can have seen it),
// or 0 if there is none.
func (km *keyModel) deleteFrom(lo int, by time.Duration) int {
	// Calls ascend with indices: the deletes called by `by` are a prefix.
	end := sort.Search(len(km.deletes), func(n int) bool { return km.write(km.deletes[n]).Call > by })
	n := sort.SearchInts(km.deletes[:end], lo)
	if n == end {
		return 0
	}
	return km.deletes[n]
}

// lastDeleteBy returns the largest index of a delete, not Failed, called no
// later than by, or 0.
func (km *keyModel) lastDeleteBy(by time.Duration) int {
	end := sort.Search(len(km.deletes), func(n int) bool { return km.write(km.deletes[n]).Call > by })
	if end == 0 {
		return 0
	}
	return km.deletes[end-1]
}

// describe names write i for a message: "write 2 (#7 c1 write k="v" [..] ok)",
// or "the initial state" for 0.
func (km *keyModel) describe(i int) string {
	if i == 0 {
		return "the initial state (not found)"
	}
	return fmt.Sprintf("write %d (%v)", i, km.write(i))
}
