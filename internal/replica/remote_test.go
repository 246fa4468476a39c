package replica_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// TestApplyRemote walks ApplyRemote's rules one write each, in one batch:
// a version too far ahead is refused and not observed, an older one is
// kept out with the version held, the same version again is applied, a
// version below its partition's horizon is kept out with the horizon
// where the key holds nothing and applied where it holds an older record,
// and the clock observes the highest version kept before any is stored.
func TestApplyRemote(t *testing.T) {
	wall := time.UnixMilli(1_800_000_000_000)
	clock, err := hlc.New(1, func() time.Time { return wall })
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	r := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}

	at := func(d time.Duration) uint64 { return hlc.VersionAt(wall.Add(d)) | 2 }
	held := at(-time.Minute)
	require.NoError(t, r.Apply([]byte("held"), &record.Record{Version: held, Value: []byte("new")}))
	// A delete of "collected"'s partition removed an hour ago raises
	// that partition's horizon; "stale" holds a record older than it.
	part, _ := partition.Of([]byte("collected"))
	gone, stale := keyIn(part, "collected"), keyIn(part, "collected", keyIn(part, "collected"))
	require.NoError(t, r.Apply([]byte(gone), &record.Record{Version: at(-3 * time.Hour), Tombstone: true}))
	require.NoError(t, r.Apply([]byte(stale), &record.Record{Version: at(-3 * time.Hour), Value: []byte("old")}))
	removed, err := st.Collect([]store.Candidate{{Key: []byte(gone), Version: at(-3 * time.Hour)}}, at(-time.Hour), nil)
	require.NoError(t, err)
	require.Len(t, removed, 1)
	horizon := st.Horizon(part)
	require.NotZero(t, horizon)

	write := func(key string, v uint64) store.Write {
		return store.Write{Key: []byte(key), Rec: &record.Record{Version: v, Value: []byte(key)}}
	}
	ws := []store.Write{
		write("ahead", at(time.Minute)),          // beyond the 500 ms bound
		write("held", at(-2*time.Minute)),        // older than what is held
		write("held", held),                      // the same write again
		write("collected", at(-2*time.Hour)),     // below the horizon, holding nothing
		write("fresh", at(200*time.Millisecond)), // within the bound: observed
		write(stale, at(-2*time.Hour)),           // below the horizon, newer than what it holds
	}
	out, err := r.ApplyRemote(ws, nil)
	require.NoError(t, err)
	require.Len(t, out, 6)
	require.ErrorIs(t, out[0].Refused, hlc.ErrTooFarAhead)
	require.Equal(t, replica.Outcome{Newer: held}, out[1])
	require.True(t, out[2].Applied())
	require.Equal(t, replica.Outcome{Newer: horizon}, out[3])
	require.True(t, out[4].Applied())
	require.True(t, out[5].Applied(), "no delete of it newer than its record was removed here")

	for key, found := range map[string]bool{"ahead": false, "collected": false, "fresh": true, "held": true, stale: true} {
		e, err := r.Get([]byte(key))
		require.NoError(t, err)
		require.Equal(t, found, e.Found, key)
	}
	next, err := clock.Next()
	require.NoError(t, err)
	require.Greater(t, next, at(200*time.Millisecond), "the clock observed the highest version kept")
	require.Less(t, next, at(time.Minute), "and not the one refused")
}

// keyIn returns a key of partition part other than those named.
func keyIn(part partition.ID, not ...string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if p, _ := partition.Of([]byte(k)); p == part && !slices.Contains(not, k) {
			return k
		}
	}
}
