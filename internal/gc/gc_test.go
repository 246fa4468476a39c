package gc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/view"
)

// TestCollectorDue: a pass runs after an exchange completed, or once a
// Grace went by, and not otherwise (each pass reads the whole index).
func TestCollectorDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	g := &Collector{o: Options{Grace: time.Hour}}
	at := func(ts ...time.Time) []view.Synced {
		out := []view.Synced{{}}
		for _, t := range ts {
			out = append(out, view.Synced{At: t, Incarnation: 7})
		}
		return out
	}
	require.True(t, g.due(t0, at(t0, t0)), "the first")
	require.False(t, g.due(t0.Add(time.Minute), at(t0, t0)), "nothing new")
	require.True(t, g.due(t0.Add(2*time.Minute), at(t0, t0.Add(time.Minute))), "an exchange completed")
	require.False(t, g.due(t0.Add(3*time.Minute), at(t0, t0.Add(time.Minute))))
	require.True(t, g.due(t0.Add(2*time.Minute+time.Hour), at(t0, t0.Add(time.Minute))), "a grace went by")
	restarted := at(t0, t0.Add(time.Minute))
	restarted[2].Incarnation = 0
	require.True(t, g.due(t0.Add(3*time.Minute+time.Hour), restarted), "an exchange with another incarnation")
}
