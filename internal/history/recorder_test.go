package history

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// memStore is a linearizable key-value store: every operation takes
// effect atomically, inside the interval the recorder stamps around it.
type memStore struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *memStore) put(k, v string, del bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if del {
		delete(s.m, k)
	} else {
		s.m[k] = v
	}
}

func (s *memStore) get(k string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[k]
	return v, ok
}

// TestRecorderUnderConcurrency records writers and readers hammering a
// linearizable store from many goroutines (run it with -race): every
// operation is recorded once, ids follow call order, the history survives
// a save and a load unchanged, and no check finds anything wrong.
func TestRecorderUnderConcurrency(t *testing.T) {
	rec := NewRecorder()
	rec.KeepOnFailure(t, "")
	store := &memStore{m: map[string]string{}}
	const writers, readers, writes, reads = 4, 6, 60, 80
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			client, key := fmt.Sprintf("w%d", w), fmt.Sprintf("k%d", w)
			for n := range writes {
				del := rng.IntN(5) == 0
				value := fmt.Sprintf("%s-%d", key, n)
				var p *Pending
				if del {
					p = rec.Delete(client, key)
				} else {
					p = rec.Write(client, key, value)
				}
				switch rng.IntN(6) {
				case 0: // refused: never applied
					p.Fail(errors.New("400"))
				case 1: // timed out: applied or not
					if rng.IntN(2) == 0 {
						store.put(key, value, del)
					}
					p.Unknown(errors.New("timeout"))
				default:
					store.put(key, value, del)
					p.OK()
				}
			}
		})
	}
	for r := range readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			client := fmt.Sprintf("r%d", r)
			for range reads {
				key := fmt.Sprintf("k%d", rng.IntN(writers))
				p := rec.Read(client, key)
				v, ok := store.get(key)
				switch {
				case rng.IntN(10) == 0:
					p.Unknown(errors.New("connection reset"))
				case ok:
					p.Found(v)
				default:
					p.NotFound()
				}
			}
		})
	}
	wg.Wait()

	h := rec.History()
	require.Len(t, h.Ops, writers*writes+readers*reads)
	for n, o := range h.Ops {
		require.Equal(t, n, o.ID)
		require.LessOrEqual(t, o.Call, o.Return)
		if n > 0 {
			require.LessOrEqual(t, h.Ops[n-1].Call, o.Call, "ids follow call order")
		}
	}

	path := filepath.Join(t.TempDir(), "h.jsonl")
	require.NoError(t, h.Save(path))
	loaded, err := Load(path)
	require.NoError(t, err)
	require.True(t, h.Start.Equal(loaded.Start))
	require.Equal(t, h.Ops, loaded.Ops)

	for _, check := range []func([]Op) ([]Violation, error){CheckReads, CheckMonotonic} {
		vs, err := check(loaded.Ops)
		require.NoError(t, err)
		require.Empty(t, vs)
	}
	final := map[string]Final{}
	for w := range writers {
		k := fmt.Sprintf("k%d", w)
		v, ok := store.get(k)
		final[k] = Final{Found: ok, Value: v}
	}
	vs, err := CheckFinal(loaded.Ops, final)
	require.NoError(t, err)
	require.Empty(t, vs)
}

func TestRecorderPendingOpsAreUnknown(t *testing.T) {
	rec := NewRecorder()
	rec.Write("c1", "k", "v1").OK()
	rec.Write("c1", "k", "v2") // never returns
	rec.Read("c2", "k")        // never returns

	h := rec.History()
	require.Len(t, h.Ops, 3)
	require.Equal(t, OK, h.Ops[0].Outcome)
	for _, o := range h.Ops[1:] {
		require.Equal(t, Unknown, o.Outcome)
		require.NotEmpty(t, o.Err)
	}
	_, err := CheckReads(h.Ops)
	require.NoError(t, err, "a pending write is the last of its key")
}

func TestPendingMisusePanics(t *testing.T) {
	rec := NewRecorder()
	w := rec.Write("c1", "k", "v")
	require.Panics(t, func() { w.Found("v") }, "a read's result for a write")
	w.OK()
	require.Panics(t, w.OK, "a second outcome")
	require.Panics(t, rec.Read("c2", "k").OK, "a write's outcome for a read")
}

func TestSaveRefusesWhatJSONWouldChange(t *testing.T) {
	rec := NewRecorder()
	rec.Write("c1", "k", "\xff").OK()
	err := rec.Save(filepath.Join(t.TempDir(), "h.jsonl"))
	require.ErrorContains(t, err, "UTF-8")
}

// fakeTB is a test whose failure and end the test below decides.
type fakeTB struct {
	failed   bool
	cleanups []func()
	logs     []string
	errs     []string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Name() string                   { return "TestSome/case 1" }
func (f *fakeTB) Failed() bool                   { return f.failed }
func (f *fakeTB) Cleanup(fn func())              { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(format string, a ...any)   { f.logs = append(f.logs, fmt.Sprintf(format, a...)) }
func (f *fakeTB) Errorf(format string, a ...any) { f.errs = append(f.errs, fmt.Sprintf(format, a...)) }

func (f *fakeTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestKeepOnFailure(t *testing.T) {
	for _, failed := range []bool{false, true} {
		dir := t.TempDir()
		rec := NewRecorder()
		rec.Write("c1", "k", "v1").OK()
		tb := &fakeTB{failed: failed}
		rec.KeepOnFailure(tb, dir)
		tb.end()
		require.Empty(t, tb.errs)
		files, err := filepath.Glob(filepath.Join(dir, "*"))
		require.NoError(t, err)
		if !failed {
			require.Empty(t, files)
			require.Empty(t, tb.logs)
			continue
		}
		require.Len(t, files, 1)
		require.Contains(t, filepath.Base(files[0]), "TestSome_case_1-")
		require.Len(t, tb.logs, 1)
		require.Contains(t, tb.logs[0], files[0], "the log names the file")
		h, err := Load(files[0])
		require.NoError(t, err)
		require.Equal(t, rec.History().Ops, h.Ops)
	}
}

func TestLoadReportsWhereAFileIsBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	rec := NewRecorder()
	rec.Read("c1", "k").NotFound()
	require.NoError(t, rec.Save(path))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("{\"id\": 1, \"bogus\": true}\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	_, err = Load(path)
	require.ErrorContains(t, err, path)
	require.ErrorContains(t, err, "op 2")
}
