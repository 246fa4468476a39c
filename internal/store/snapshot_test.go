package store

import (
	"io"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
)

// A checkpoint holds the store's records, the time it was taken and the
// time up to which it is complete (SnapshotMark); a store opened on it
// says it is a restored snapshot until ForgetSnapshot, and the live store
// never does. A completeness not known reads as zero. A mark that does
// not start with a time is an error, not a directory taken for the
// node's own.
func TestCheckpointMark(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: fs}
	s, err := Open("node1", o)
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Apply([]byte("k"), &record.Record{Version: 7, Value: []byte("v")}))
	before := time.Now()
	complete := before.Add(-time.Minute).Truncate(time.Millisecond)
	require.NoError(t, s.Checkpoint("snap", complete))
	require.NoError(t, s.Checkpoint("unknown", time.Time{}))
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
	_, found, err := get(r, []byte("k"))
	require.NoError(t, err)
	require.True(t, found, "the records are there")
	require.NoError(t, r.ForgetSnapshot())
	_, ok, err = r.RestoredSnapshot()
	require.NoError(t, err)
	require.False(t, ok, "forgotten")
	require.NoError(t, r.ForgetSnapshot(), "twice is no error")

	f, err := fs.Create(fs.PathJoin("snap", SnapshotMark), vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = io.WriteString(f, "yesterday\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, _, err = r.RestoredSnapshot()
	require.ErrorContains(t, err, `its first line "yesterday" is not the time the snapshot was taken`)
	require.NoError(t, r.Close())

	u, err := Open("unknown", o)
	require.NoError(t, err)
	defer u.Close()
	snap, ok, err = u.RestoredSnapshot()
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, snap.Complete.IsZero(), "not known")
}
