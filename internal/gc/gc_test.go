package gc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCollectorDue: a pass runs after an exchange completed, or once a
// Grace went by, and not otherwise (each pass reads the whole index).
func TestCollectorDue(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	g := &Collector{o: Options{Grace: time.Hour}}
	a := []time.Time{{}, t0, t0}
	require.True(t, g.due(t0, a), "the first")
	require.False(t, g.due(t0.Add(time.Minute), []time.Time{{}, t0, t0}), "nothing new")
	require.True(t, g.due(t0.Add(2*time.Minute), []time.Time{{}, t0, t0.Add(time.Minute)}), "an exchange completed")
	require.False(t, g.due(t0.Add(3*time.Minute), []time.Time{{}, t0, t0.Add(time.Minute)}))
	require.True(t, g.due(t0.Add(2*time.Minute+time.Hour), []time.Time{{}, t0, t0.Add(time.Minute)}), "a grace went by")
}
