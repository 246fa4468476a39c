package lograte

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The window and bound of the tests: those of the map log's raft lines.
const window, maxKeys = 30 * time.Second, 1024

// A limiter logs the first occurrence of a key at once, then one per
// window while it repeats, with how many were not logged since the
// last; a line after a window of quiet starts afresh. The clock is a
// fake one: each step advances it by its after.
func TestNote(t *testing.T) {
	hb := "failed to heartbeat to 10.0.0.2:7000"
	hb3 := "failed to heartbeat to 10.0.0.3:7000"
	ae := "failed to appendEntries to 2"
	type step struct {
		after time.Duration // the clock advances by it first
		key   string
		want  Verdict
	}
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	logged := Verdict{Log: true}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the first is logged", []step{{0, hb, logged}}},
		{"repeats within the window are not", []step{
			{0, hb, logged}, {time.Second, hb, Verdict{}}, {28 * time.Second, hb, Verdict{}},
		}},
		{"the window passed: one line with the count", []step{
			{0, hb, logged}, {10 * time.Second, hb, Verdict{}}, {10 * time.Second, hb, Verdict{}},
			{10 * time.Second, hb, Verdict{Log: true, Suppressed: 2, Since: at(0)}},
			{10 * time.Second, hb, Verdict{}},
			{20 * time.Second, hb, Verdict{Log: true, Suppressed: 1, Since: at(30 * time.Second)}},
		}},
		{"a peer of its own, a message of its own", []step{
			{0, hb, logged}, {0, hb3, logged}, {0, ae, logged}, {time.Second, hb, Verdict{}},
			{0, hb3, Verdict{}}, {0, ae, Verdict{}},
		}},
		{"quiet for a window: afresh", []step{
			{0, hb, logged}, {time.Second, hb, Verdict{}}, {window, hb, logged}, {time.Second, hb, Verdict{}},
		}},
		{"a line every window is logged, each a first", []step{
			{0, hb, logged}, {window, hb, logged}, {window, hb, logged},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			r := New[string](window, maxKeys, func() time.Time { return now })
			for i, s := range tc.steps {
				now = now.Add(s.after)
				assert.Equal(t, s.want, r.Note(s.key), "step %d at %v", i, now.Sub(t0))
			}
		})
	}
}

// A limiter remembers at most its max keys and one shared entry for the
// others: those quiet for a window are forgotten first, and the keys
// beyond are limited as one.
func TestBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := New[string](window, maxKeys, func() time.Time { return now })
	key := func(i int) string { return "failed to heartbeat to " + strconv.Itoa(i) }
	for i := range maxKeys {
		require.True(t, r.Note(key(i)).Log)
	}
	require.True(t, r.Note(key(maxKeys)).Log, "the first beyond the bound: the shared entry's first")
	require.False(t, r.Note(key(maxKeys+1)).Log, "the next shares its window")
	require.False(t, r.Note(key(0)).Log, "a remembered pair keeps its own")
	require.Equal(t, maxKeys+1, r.Len())

	now = now.Add(window)
	require.True(t, r.Note(key(maxKeys+2)).Log, "the quiet ones are forgotten for it")
	require.LessOrEqual(t, r.Len(), maxKeys+1)
	for i := range 3 * maxKeys {
		now = now.Add(time.Millisecond)
		r.Note(key(i))
	}
	require.LessOrEqual(t, r.Len(), maxKeys+1)
}
