package store

import (
	"io"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
)

// A checkpoint holds the store's records, the time it was taken, the
// time up to which it is complete and the cluster's shortest grace then
// (SnapshotMark); a store opened on it says it is a restored snapshot
// until ForgetSnapshot, and the live store never does. A completeness or
// grace not known reads as zero, as does the grace of an earlier
// release's mark, which has no such line. A mark that does not start with
// a time, or whose grace line gives none, is an error, not a directory
// taken for the node's own.
func TestCheckpointMark(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: fs}
	s, err := Open("node1", o)
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Apply([]byte("k"), &record.Record{Version: 7, Value: []byte("v")}))
	before := time.Now()
	complete := before.Add(-time.Minute).Truncate(time.Millisecond)
	require.NoError(t, s.Checkpoint("snap", complete, 90*time.Minute))
	require.NoError(t, s.Checkpoint("unknown", time.Time{}, 0))
	_, ok, err := s.RestoredSnapshot()
	require.NoError(t, err)
	require.False(t, ok, "the live store is no snapshot")

	r, err := Open("snap", o)
	require.NoError(t, err)
	snap, ok, err := r.RestoredSnapshot()
	require.NoError(t, err)
	require.True(t, ok)
	require.WithinRange(t, snap.Taken, before.Add(-time.Millisecond), time.Now())
	require.True(t, complete.Equal(snap.Complete), "%v", snap.Complete)
	require.Equal(t, 90*time.Minute, snap.Grace)
	_, found, err := get(r, []byte("k"))
	require.NoError(t, err)
	require.True(t, found, "the records are there")
	require.NoError(t, r.ForgetSnapshot())
	_, ok, err = r.RestoredSnapshot()
	require.NoError(t, err)
	require.False(t, ok, "forgotten")
	require.NoError(t, r.ForgetSnapshot(), "twice is no error")

	mark := func(text string) {
		f, err := fs.Create(fs.PathJoin("snap", SnapshotMark), vfs.WriteCategoryUnspecified)
		require.NoError(t, err)
		_, err = io.WriteString(f, text)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	mark("yesterday\n")
	_, _, err = r.RestoredSnapshot()
	require.ErrorContains(t, err, `its first line "yesterday" is not the time the snapshot was taken`)
	mark("2026-11-28T10:00:00Z\n2026-11-28T09:59:00Z\ngc-grace soon\n")
	_, _, err = r.RestoredSnapshot()
	require.ErrorContains(t, err, `its third line "gc-grace soon" does not give a positive garbage-collection grace`)
	// An earlier release's mark: two times, then its text.
	mark("2026-11-28T10:00:00Z\n2026-11-28T09:59:00Z\nwhen this dhtkv snapshot was taken, and up to when it holds every write\n")
	snap, ok, err = r.RestoredSnapshot()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 11, 28, 9, 59, 0, 0, time.UTC), snap.Complete.UTC())
	require.Zero(t, snap.Grace, "not recorded")
	require.NoError(t, r.Close())

	u, err := Open("unknown", o)
	require.NoError(t, err)
	defer u.Close()
	snap, ok, err = u.RestoredSnapshot()
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, snap.Complete.IsZero(), "not known")
	require.Zero(t, snap.Grace, "not known")
}
