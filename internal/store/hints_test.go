package store

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
)

// TestHints: hints are kept per target, oldest version first; a walk can
// resume past a hint; deleted hints are gone; HintBytes counts what is
// left.
func TestHints(t *testing.T) {
	s := open(t, t.TempDir())
	add := func(target int, v uint64, key string) Hint {
		h := Hint{Target: target, Key: []byte(key), Envelope: (&record.Record{Version: v, Value: []byte("v")}).Encode()}
		require.NoError(t, s.AddHint(h))
		return h
	}
	var hs []Hint
	for i, v := range []uint64{30, 10, 20, 50, 40} {
		hs = append(hs, add(1, v, fmt.Sprintf("k%d", i)))
	}
	other := add(2, 5, "other")
	walk := func(after *Hint) (versions []uint64) {
		require.NoError(t, s.Hints(1, after, func(h Hint) bool {
			versions = append(versions, h.Version())
			return true
		}))
		return versions
	}
	require.Equal(t, []uint64{10, 20, 30, 40, 50}, walk(nil))
	require.Equal(t, []uint64{40, 50}, walk(&hs[0]), "past version 30")
	require.NoError(t, s.DeleteHints(hs[1:3])) // versions 10 and 20
	require.Equal(t, []uint64{30, 40, 50}, walk(nil))
	bytes, err := s.HintBytes()
	require.NoError(t, err)
	require.Equal(t, int64(3*hs[0].Size()), bytes[1])
	require.Equal(t, int64(other.Size()), bytes[2])
}
