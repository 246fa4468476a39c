package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// SnapshotMark is the file Checkpoint writes into a checkpoint beside
// Pebble's files: when it was taken, up to when it holds every write, and
// the shortest garbage-collection grace in the cluster then (Snapshot). A node started on a copy of the checkpoint (a backup
// restored) finds it (RestoredSnapshot), weighs the snapshot's age
// against the time the other replicas keep deletes, and removes it
// (ForgetSnapshot). Pebble ignores files it does not know.
const SnapshotMark = "DHTKV-SNAPSHOT"

// snapshotMarkText follows the times in the mark, for whoever opens it.
const snapshotMarkText = "when this dhtkv snapshot was taken, up to when it holds every write the cluster acknowledged (unknown: it may lack any), and the shortest --gc-grace of the cluster's nodes then; a node started on a copy of the directory checks the second against the third and its own --gc-grace, then removes this file\n"

// markGrace begins the mark's third line, Snapshot.Grace.
const markGrace = "gc-grace "

// markUnknown stands for a zero Snapshot.Complete in the mark.
const markUnknown = "unknown"

// Snapshot is what a checkpoint's SnapshotMark says of it.
type Snapshot struct {
	// Taken is when the checkpoint was taken.
	Taken time.Time
	// Complete is the time up to which the checkpoint holds every write
	// the cluster acknowledged, deletes included, as the node that took
	// it knew (zero: unknown). It lacks only writes made after Complete,
	// which the other replicas keep for at least the garbage
	// collection's grace.
	Complete time.Time
	// Grace is the shortest garbage-collection grace (--gc-grace) among
	// the nodes of the cluster that the node taking the snapshot knew
	// of then, itself included (0: not recorded; a mark of an earlier
	// release). The others collect a delete once it is older than their
	// own grace.
	Grace time.Duration
}

// Checkpoint writes a consistent copy of the store (records, hints, the
// anti-entropy index, the identity, the clock bound and the GC horizon) as
// of one instant into dir, which must not exist (its parents are
// created), on the store's file system (Options.FS), and marks it with
// that instant, complete and grace (SnapshotMark, Snapshot.Complete and
// Grace; the caller knows them: the node, from its anti-entropy exchanges
// and its peers' ping answers). The copy
// hard-links the sstables where the file system allows, so it costs
// little space until the store compacts them away.
//
// dir holds a whole, marked checkpoint or nothing, even across a crash:
// the copy and its mark are written into a sibling, "." + dir's name +
// ".partial-" and a number, which is renamed to dir once both are
// durable (a checkpoint without its mark would be restored unchecked).
// A crash before the rename leaves the sibling, which is no snapshot,
// for the operator to remove.
func (s *Store) Checkpoint(dir string, complete time.Time, grace time.Duration) error {
	if err := s.Failure(); err != nil {
		// Its WAL flush would wait on a commit pipeline the failure may have stopped.
		return fmt.Errorf("checkpoint of %s: %w", s.dir, err)
	}
	if _, err := s.fs.Stat(dir); err == nil {
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, err)
	}
	partial := s.fs.PathJoin(s.fs.PathDir(dir), "."+s.fs.PathBase(dir)+".partial-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	made := s.missingParents(dir)
	// Before the copy: every write it holds was acknowledged after this,
	// or before; a delete it lacks was made after this.
	taken := time.Now()
	if err := s.db.Checkpoint(partial, pebble.WithFlushedWAL()); err != nil {
		s.removeEmpty(made)
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, partial, err)
	}
	err := writeMark(s.fs, partial, Snapshot{Taken: taken, Complete: complete, Grace: grace})
	if err == nil {
		err = s.fs.Rename(partial, dir)
	}
	if err != nil {
		if s.fs.RemoveAll(partial) == nil {
			s.removeEmpty(made)
		}
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, err)
	}
	if err := syncDir(s.fs, s.fs.PathDir(dir)); err != nil {
		return fmt.Errorf("checkpoint of %s in %s: %w", s.dir, dir, err)
	}
	return nil
}

// missingParents are the directories above dir that do not exist yet,
// the deepest first: those a checkpoint into dir makes (Pebble's
// Checkpoint makes its destination's parents).
func (s *Store) missingParents(dir string) []string {
	var missing []string
	for p := s.fs.PathDir(dir); ; p = s.fs.PathDir(p) {
		if _, err := s.fs.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			return missing
		}
		missing = append(missing, p)
		if s.fs.PathDir(p) == p {
			return missing
		}
	}
}

// removeEmpty removes, deepest first, the directories a failed checkpoint
// made (missingParents), each only if it is empty: a failed snapshot
// leaves no directories behind, nor removes anything another writer put
// there meanwhile.
func (s *Store) removeEmpty(made []string) {
	for _, d := range made {
		if ls, err := s.fs.List(d); err != nil || len(ls) > 0 || s.fs.Remove(d) != nil {
			return
		}
	}
}

// writeMark writes dir's SnapshotMark durably: the two times, a line
// each, the grace's line if known, then snapshotMarkText. A release that
// reads only the first two lines ignores the rest.
func writeMark(fsys vfs.FS, dir string, snap Snapshot) error {
	f, err := fsys.Create(fsys.PathJoin(dir, SnapshotMark), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("mark the snapshot: %w", err)
	}
	complete := markUnknown
	if !snap.Complete.IsZero() {
		complete = snap.Complete.UTC().Format(time.RFC3339Nano)
	}
	grace := ""
	if snap.Grace > 0 {
		grace = markGrace + snap.Grace.String() + "\n"
	}
	_, err = io.WriteString(f, snap.Taken.UTC().Format(time.RFC3339Nano)+"\n"+complete+"\n"+grace+snapshotMarkText)
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
// there), and what the mark says of it.
func (s *Store) RestoredSnapshot() (snap Snapshot, ok bool, err error) {
	path := s.fs.PathJoin(s.dir, SnapshotMark)
	f, err := s.fs.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Snapshot{}, false, nil
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	lines := strings.SplitN(string(b), "\n", 4)
	if snap.Taken, err = time.Parse(time.RFC3339Nano, lines[0]); err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s: its first line %q is not the time the snapshot was taken: %w", path, lines[0], err)
	}
	if len(lines) >= 3 {
		if g, ok := strings.CutPrefix(lines[2], markGrace); ok {
			if snap.Grace, err = time.ParseDuration(g); err != nil || snap.Grace <= 0 {
				return Snapshot{}, false, fmt.Errorf("read %s: its third line %q does not give a positive garbage-collection grace", path, lines[2])
			}
		}
	}
	if len(lines) < 2 || lines[1] == markUnknown {
		return snap, true, nil
	}
	if snap.Complete, err = time.Parse(time.RFC3339Nano, lines[1]); err != nil {
		return Snapshot{}, false, fmt.Errorf("read %s: its second line %q is neither %q nor the time up to which the snapshot is complete: %w", path, lines[1], markUnknown, err)
	}
	return snap, true, nil
}

// ForgetSnapshot removes the store directory's SnapshotMark, durably:
// the node has started on it, and later starts are ordinary restarts.
func (s *Store) ForgetSnapshot() error {
	if err := s.fs.Remove(s.fs.PathJoin(s.dir, SnapshotMark)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the snapshot mark: %w", err)
	}
	return syncDir(s.fs, s.dir)
}
