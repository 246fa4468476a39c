package store

import (
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

// A snapshot whose destination cannot take it (a backup volume that
// fills, or fails) fails the snapshot, and only the snapshot: the store
// goes on taking writes, keeps its ballast, and its space guard does not
// take the data volume for full. Pebble's Checkpoint writes its copy
// through the store's Pebble FS; through watchFS and vfs.OnDiskFull, an
// error writing the copy's MANIFEST or WAL was taken for the store's own
// failing, an EIO anywhere in the copy for the data disk failing, and an
// ENOSPC anywhere in it spent the data volume's ballast. Files outside
// the store's directory now bypass both.
func TestCheckpointToAFailingDestinationLeavesTheStoreAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fails tells whether a write of the copy's file base fails, and with what.
		fails func(base string) error
	}{
		{"backup volume fills at the copy's MANIFEST", func(base string) error {
			if strings.HasPrefix(base, "MANIFEST") {
				return syscall.ENOSPC
			}
			return nil
		}},
		{"backup volume fills at the copy's WAL", func(base string) error {
			if strings.HasSuffix(base, ".log") {
				return syscall.ENOSPC
			}
			return nil
		}},
		{"backup volume full", func(string) error { return syscall.ENOSPC }},
		{"backup disk fails", func(string) error { return syscall.EIO }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
				if !strings.HasPrefix(op.Path, "/backup/") ||
					(op.Kind != errorfs.OpFileWrite && op.Kind != errorfs.OpFileWriteAt) {
					return nil
				}
				i := strings.LastIndex(op.Path, "/")
				if errno := tc.fails(op.Path[i+1:]); errno != nil {
					return &os.PathError{Op: "write", Path: op.Path, Err: errno}
				}
				return nil
			})
			vol := newVolume(500*mib, 1000*mib) // the data volume: plenty free
			s := guarded(t, errorfs.Wrap(vfs.NewMem(), inj), vol, func(o *Options) {
				o.Ballast = sizeflag.Amount{Bytes: 256 << 10}
				o.SpaceCheckInterval = time.Hour // as read at Open: 500 MiB free
			})
			defer s.Close()
			require.NoError(t, s.Apply([]byte("a"), rec(1, "before")))
			require.NoError(t, s.db.Flush()) // an sstable to link
			require.NoError(t, s.Apply([]byte("w"), rec(2, "in the WAL")))

			require.Error(t, s.Checkpoint("/backup/snap", time.Time{}, 0), "the destination cannot take it")

			require.NoError(t, s.Failure(), "a failed snapshot must not fail the store")
			require.NoError(t, s.Apply([]byte("b"), rec(3, "after the failed snapshot")), "the data volume is not full")
			require.Equal(t, uint64(256<<10), s.Space().BallastBytes, "the data volume's ballast is not spent on the backup volume's ENOSPC")
		})
	}
}

// A snapshot whose mark cannot be written fails, and leaves nothing in
// its directory (admin.SnapshotHandler: "500 when the checkpoint failed
// (nothing is left in dir)"): a directory holding the checkpoint without
// its mark is a store that RestoredSnapshot takes for no snapshot, so a
// node restored from it would skip the age check against --gc-grace. Nor
// does a crash after the copy, before its mark (played by a clean-up that
// fails too): the copy is made beside dir and renamed to it marked. The
// directories the snapshot made above dir are removed with it (they were
// left, empty).
func TestCheckpointWhoseMarkFailsLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		crash bool // nothing removes what the failed snapshot wrote
	}{
		{"the mark fails", false},
		{"a crash before the mark", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var healed atomic.Bool
			inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
				if healed.Load() {
					return nil
				}
				if strings.HasSuffix(op.Path, "/"+SnapshotMark) && op.Kind.ReadOrWrite() == errorfs.OpIsWrite ||
					tc.crash && op.Kind == errorfs.OpRemoveAll && strings.HasPrefix(op.Path, "/backup/") {
					return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
				}
				return nil
			})
			fs := errorfs.Wrap(vfs.NewMem(), inj)
			s := guarded(t, fs, newVolume(500*mib, 1000*mib), nil)
			defer s.Close()
			require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))

			require.NoError(t, fs.MkdirAll("/backup", 0o755))
			require.Error(t, s.Checkpoint("/backup/nightly/1/snap", time.Now(), time.Hour), "the mark cannot be written")
			_, err := fs.Stat("/backup/nightly/1/snap")
			require.ErrorIs(t, err, os.ErrNotExist)
			ls, err := fs.List("/backup")
			require.NoError(t, err)
			if tc.crash {
				require.Equal(t, []string{"nightly"}, ls, "the partial copy's parents stay with it")
			} else {
				require.Empty(t, ls, "the directories it made are removed; /backup was there before")
			}

			require.Error(t, s.Checkpoint("/backup/snap", time.Now(), time.Hour), "the mark cannot be written")

			_, err = fs.Stat("/backup/snap")
			if err == nil {
				ls, _ := fs.List("/backup/snap")
				r, err := Open("/backup/snap", Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: fs})
				require.NoError(t, err)
				defer r.Close()
				_, restored, err := r.RestoredSnapshot()
				require.NoError(t, err)
				t.Fatalf("a failed snapshot left %v in its directory, which opens as a store that is no restored snapshot (RestoredSnapshot: %v)", ls, restored)
			}
			ls, err = fs.List("/backup")
			require.NoError(t, err)
			if tc.crash {
				ls = slices.DeleteFunc(ls, func(n string) bool { return n == "nightly" })
				require.Len(t, ls, 1, "the partial copy beside it")
				require.True(t, strings.HasPrefix(ls[0], ".snap.partial-"), ls[0])
			} else {
				require.Empty(t, ls)
			}

			// The same directory then takes a whole snapshot.
			healed.Store(true)
			require.NoError(t, s.Checkpoint("/backup/snap2", time.Now(), time.Hour))
		})
	}
}
