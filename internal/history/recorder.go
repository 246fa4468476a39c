package history

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Recorder collects a history from concurrent clients. Its methods are safe
// for concurrent use.
//
// A client announces an operation just before sending it, and reports the
// outcome just after the answer (or the error) arrived:
//
//	p := rec.Write("c1", key, value)
//	err := put(key, value)
//	switch { case err == nil: p.OK(); case definite(err): p.Fail(err); default: p.Unknown(err) }
//
// so that the recorded interval contains the operation's whole life on the
// wire. Both times are read from the recorder's monotonic clock.
type Recorder struct {
	start time.Time // carries the monotonic reading every offset is taken from

	mu      sync.Mutex
	last    time.Duration // the latest stamp given (stamp)
	nextID  int
	done    []Op
	pending map[int]*Pending
}

// NewRecorder starts a recorder; its clock's offset 0 is now.
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now(), pending: make(map[int]*Pending)}
}

// Now is the recorder's clock: the time since it started.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Write announces client's write of value to key.
func (r *Recorder) Write(client, key, value string) *Pending {
	return r.invoke(Op{Client: client, Kind: Write, Key: key, Value: value})
}

// Delete announces client's delete of key.
func (r *Recorder) Delete(client, key string) *Pending {
	return r.invoke(Op{Client: client, Kind: Write, Key: key, Delete: true})
}

// Read announces client's read of key.
func (r *Recorder) Read(client, key string) *Pending {
	return r.invoke(Op{Client: client, Kind: Read, Key: key})
}

// stamp returns the clock's reading, made strictly later than every stamp
// before it; r.mu must be held. Every call and return is stamped under
// the lock, so that one operation's return stamped before another's call
// compares before it even where the clock did not move between them (in
// a synctest bubble a request in memory takes no time).
func (r *Recorder) stamp() time.Duration {
	now := r.Now()
	if now <= r.last {
		now = r.last + 1
	}
	r.last = now
	return now
}

// invoke stamps the call time and the id under one lock, so ids follow
// call order.
func (r *Recorder) invoke(op Op) *Pending {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = r.nextID
	r.nextID++
	op.Call = r.stamp()
	p := &Pending{r: r, op: op}
	r.pending[op.ID] = p
	return p
}

// History returns what has been recorded so far, in call order. An
// operation still pending is included as Unknown, returning now: a write
// that never returned may still take effect, and it must be the last of its
// key, since its client could not issue another.
func (r *Recorder) History() History {
	r.mu.Lock()
	now := r.stamp() // under the lock: after every pending call
	ops := slices.Clone(r.done)
	for _, p := range r.pending {
		op := p.op
		op.Return, op.Outcome, op.Err = now, Unknown, "still pending when the history was taken"
		ops = append(ops, op)
	}
	r.mu.Unlock()
	slices.SortFunc(ops, func(a, b Op) int { return a.ID - b.ID })
	return History{Start: r.start, Ops: ops}
}

// Save writes the history so far to path (see History.Save).
func (r *Recorder) Save(path string) error { return r.History().Save(path) }

// TB is the part of testing.TB that KeepOnFailure uses.
type TB interface {
	Helper()
	Name() string
	Failed() bool
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
}

// KeepOnFailure saves the history when t ends, if t failed, and logs where.
// dir is where to put it; "" means the system's temporary directory. Not
// t.TempDir(): the testing package removes that when the test ends, failed
// or not.
func (r *Recorder) KeepOnFailure(t TB, dir string) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		name := strings.Map(func(c rune) rune {
			if c == '/' || c == '\\' || c == ' ' {
				return '_'
			}
			return c
		}, t.Name())
		f, err := os.CreateTemp(dir, name+"-*.history.jsonl")
		if err != nil {
			t.Errorf("history: keep %s: %v", t.Name(), err)
			return
		}
		path := f.Name()
		_ = f.Close()
		if err := r.Save(path); err != nil {
			t.Errorf("%v", err)
			return
		}
		t.Logf("history of the failed test kept in %s", path)
	})
}

// Pending is an announced operation waiting for its outcome. Exactly one of
// its methods must be called, once, by the client that announced it; any
// other use is a bug in the test and panics.
type Pending struct {
	r  *Recorder
	op Op
}

// OK records that the store acknowledged a write.
func (p *Pending) OK() { p.finish(Write, OK, false, "", nil) }

// Found records that a read returned value.
func (p *Pending) Found(value string) { p.finish(Read, OK, true, value, nil) }

// NotFound records that a read found no value.
func (p *Pending) NotFound() { p.finish(Read, OK, false, "", nil) }

// Fail records a definite failure: the operation was not applied.
func (p *Pending) Fail(err error) { p.finish("", Failed, false, "", err) }

// Unknown records that the outcome is unknown (timeout, connection error,
// 504): a write may have been applied, now or later.
func (p *Pending) Unknown(err error) { p.finish("", Unknown, false, "", err) }

func (p *Pending) finish(kind Kind, outcome Outcome, found bool, value string, err error) {
	if kind != "" && kind != p.op.Kind {
		panic(fmt.Sprintf("history: %s outcome given to %v", kind, p.op))
	}
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	if _, ok := p.r.pending[p.op.ID]; !ok {
		panic(fmt.Sprintf("history: second outcome for %v", p.op))
	}
	ret := p.r.stamp()
	delete(p.r.pending, p.op.ID)
	op := p.op
	op.Return, op.Outcome = ret, outcome
	if op.Kind == Read {
		op.Found, op.Value = found, value
	}
	if err != nil {
		op.Err = err.Error()
	}
	p.r.done = append(p.r.done, op)
}
