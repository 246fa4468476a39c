package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// SnapshotMark is the file Checkpoint writes into a checkpoint beside
// Pebble's files: the time it was taken. A node started on a copy of the
// checkpoint (a backup restored) finds it (RestoredSnapshot), weighs the
// snapshot's age against the time the other replicas keep deletes, and
// removes it (ForgetSnapshot). Pebble ignores files it does not know.
const SnapshotMark = "DHTKV-SNAPSHOT"

// snapshotMarkText follows the time in the mark, for whoever opens it.
const snapshotMarkText = "when this dhtkv snapshot was taken; a node started on a copy of the directory checks its age against --gc-grace, then removes this file\n"

// Checkpoint writes a consistent copy of the store (records, hints, the
// anti-entropy index, the identity, the clock bound and the GC horizon) as
// of one instant into dir, which must not exist (its parents are
// created), on the store's file system (Options.FS), and marks it with
// that instant (SnapshotMark). The copy hard-links the sstables where the
// file system allows, so it costs little space until the store compacts
// them away.
func (s *Store) Checkpoint(dir string) error {
	if err := s.Failure(); err != nil {
		// Its WAL flush would wait on a commit pipeline the failure may have stopped.
		return fmt.Errorf("checkpoint of %s: %w", s.dir, err)
	}
	// Before the copy: every write it holds was acknowledged after this,
	// or before; a delete it lacks was made after this.
	taken := time.Now()
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, err)
	}
	if err := writeMark(s.fs, dir, taken); err != nil {
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, err)
	}
	return nil
}

// writeMark writes dir's SnapshotMark durably.
func writeMark(fsys vfs.FS, dir string, taken time.Time) error {
	f, err := fsys.Create(fsys.PathJoin(dir, SnapshotMark), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("mark the snapshot: %w", err)
	}
	_, err = io.WriteString(f, taken.UTC().Format(time.RFC3339Nano)+"\n"+snapshotMarkText)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("mark the snapshot: %w", err)
	}
	return syncDir(fsys, dir)
}

func syncDir(fsys vfs.FS, dir string) error {
	d, err := fsys.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	if err := errors.Join(d.Sync(), d.Close()); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// RestoredSnapshot reports whether the store's directory is a copy of a
// checkpoint the node has not started on before (its SnapshotMark is
// there), and when the checkpoint was taken.
func (s *Store) RestoredSnapshot() (taken time.Time, ok bool, err error) {
	path := s.fs.PathJoin(s.dir, SnapshotMark)
	f, err := s.fs.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	taken, err = time.Parse(time.RFC3339Nano, line)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read %s: its first line %q is not the time the snapshot was taken: %w", path, line, err)
	}
	return taken, true, nil
}

// ForgetSnapshot removes the store directory's SnapshotMark, durably:
// the node has started on it, and later starts are ordinary restarts.
func (s *Store) ForgetSnapshot() error {
	if err := s.fs.Remove(s.fs.PathJoin(s.dir, SnapshotMark)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the snapshot mark: %w", err)
	}
	return syncDir(s.fs, s.dir)
}
