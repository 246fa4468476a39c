package store

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// TestAwaitCommitsWaitsForACollectInFlightOnAFailedStore: a store can
// fail without parking anything inside Pebble: an EIO on an sstable (a
// compaction's or a flush's output, fileError) fails it while Pebble goes
// on, and the commits already past Store.write's check complete. A
// Collect whose synced commit is under way when that happens finishes
// (its summary touched, its lock released) after AwaitCommits returned,
// which AwaitCommits promises against ("every Collect under way has
// committed or withdrawn"): an exchange that starts then hashes the
// partition from a summary that still holds the removed record, and
// package membership's barrier (no removal decided under the old map
// completes after the node acknowledges the new one) does not hold.
func TestAwaitCommitsWaitsForACollectInFlightOnAFailedStore(t *testing.T) {
	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		isSync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
		if isSync && hold.Load() && strings.HasSuffix(op.Path, ".log") {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	s, err := Open("db", Options{FS: errorfs.Wrap(vfs.NewMem(), inj), Sync: true})
	require.NoError(t, err)
	defer s.Close()
	releaseSync := sync.OnceFunc(func() { close(release) })
	defer releaseSync()

	v := msVersion(1000)
	key := []byte("k")
	part, _ := partition.Of(key)
	require.NoError(t, s.Apply(key, rec(v, "")))
	withK, _, err := s.PartitionHash(part) // the summary is current
	require.NoError(t, err)

	hold.Store(true)
	collected := make(chan error, 1)
	go func() {
		_, err := s.Collect([]Candidate{{Key: key, Version: v}}, v+1, nil)
		collected <- err
	}()
	<-held // the Collect holds the lock, its commit waits for the WAL's sync
	hold.Store(false)
	// An sstable's write fails with EIO: the store fails, Pebble goes on.
	s.fileError("db/000042.sst", &os.PathError{Op: "write", Path: "db/000042.sst", Err: syscall.EIO})
	require.ErrorIs(t, s.Failure(), ErrStoreFailed)

	awaited := make(chan uint64, 1)
	go func() {
		s.AwaitCommits()
		h, _, _ := s.PartitionHash(part) // an exchange's first hash
		awaited <- h
	}()
	var h uint64
	early := false
	select {
	case h = <-awaited:
		early = true
	case <-time.After(200 * time.Millisecond): // the sync, however long
	}
	releaseSync()
	require.NoError(t, <-collected, "the Collect's commit was past the failure check: it commits")
	_, found, err := s.Version(key)
	require.NoError(t, err)
	require.False(t, found)
	if !early {
		select {
		case h = <-awaited:
		case <-time.After(5 * time.Second):
			t.Fatal("AwaitCommits did not return")
		}
	}
	assert.False(t, early, "AwaitCommits returned while a Collect under way had not committed")
	assert.NotEqual(t, withK, h, "the exchange hashed the removed record")
}
