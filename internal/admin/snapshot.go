package admin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// Checkpointer makes a consistent copy of a node's store: everything its
// data directory holds (records, hints, the anti-entropy index, the
// directory's identity, the clock bound) as of one instant, written to
// dir, which must not exist (its parents are created). A node started on
// the copy as its data directory is the node as it was at that instant.
// The store implements it with Pebble's DB.Checkpoint, which hard-links
// sstables when dir is on the same filesystem and copies them otherwise.
// complete is the time up to which the copy holds every write the
// cluster acknowledged (zero: not known), which a node started on it
// weighs against the garbage collection's grace.
type Checkpointer interface {
	Checkpoint(dir string) (complete time.Time, err error)
}

// nameMax and pathMax are Linux's NAME_MAX and PATH_MAX (a name in a
// directory, a whole path with its NUL); checkpointNameRoom is kept in a
// snapshot's path for the names of the files the checkpoint writes in it
// (MANIFEST-000001, marker.manifest.000001.MANIFEST-000001, ...).
const (
	nameMax            = 255
	pathMax            = 4096
	checkpointNameRoom = 64
	// partialNameRoom is what store.Checkpoint adds to the last name for
	// the sibling it writes the copy into first: "." + name + ".partial-"
	// + time.Now().UnixNano() in base 36 (at most 13 digits).
	partialNameRoom = len(".") + len(".partial-") + 13
)

// unknownComplete is the answer's warning for a snapshot whose
// completeness is not known.
const unknownComplete = "completeness unknown: the node had not completed an anti-entropy exchange with every peer since its start (POST /repair first); a node started on this snapshot refuses to without --restore-old-snapshot"

// SnapshotHandler serves the backup trigger:
//
//	POST /snapshot?dir=PATH   checkpoint the store into PATH; answer when
//	                          done, with a client.Snapshot
//
// PATH is a new directory inside root (--snapshot-dir, an absolute path on
// the node's machine): relative to root, or absolute and under it. It may
// not contain "..", and no directory between root and it may be a
// symbolic link, so that whoever may ask for a snapshot writes nowhere
// else on the node's disk (snapshotTarget). The checkpoint creates the
// missing directories between root and PATH, root included (0700 under
// the node's umask). The answers: 200 and the JSON; 400 for a missing dir,
// one with a control character or one that breaks those rules, another
// parameter or a malformed query; 409 when dir exists or another snapshot is
// running (one at a time: each pins the store's files while it copies);
// 405 for another method; 501 when cp is nil (the node's store cannot
// checkpoint); 500 when the checkpoint failed (nothing is left in dir).
// The request is checked before cp, so its rules hold whatever the store.
func SnapshotHandler(cp Checkpointer, root string, log *slog.Logger) http.Handler {
	var running sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			plain(w, http.StatusMethodNotAllowed, "method not allowed: use POST")
			return
		}
		q, err := queryparam.Strict(r.URL.RawQuery, "dir=PATH, the new directory to write the snapshot to", "dir")
		var target string
		if err == nil {
			target, err = queryparam.One("dir", q["dir"])
		}
		if err != nil {
			plain(w, http.StatusBadRequest, err.Error())
			return
		}
		dir, code, why := snapshotTarget(root, target)
		switch {
		case why != "":
			plain(w, code, why)
			return
		case cp == nil:
			plain(w, http.StatusNotImplemented, "this node's store cannot make snapshots")
			return
		}
		if !running.TryLock() {
			plain(w, http.StatusConflict, "a snapshot is already running")
			return
		}
		defer running.Unlock()
		unboundedWrite(w) // a checkpoint that copies (another filesystem) takes as long as the copy
		start := time.Now()
		complete, err := cp.Checkpoint(dir)
		if err != nil {
			log.Error("snapshot failed", "dir", dir, "err", err)
			plain(w, http.StatusInternalServerError, "snapshot failed: "+err.Error())
			return
		}
		s := client.Snapshot{Dir: dir, DurationSeconds: time.Since(start).Seconds()}
		if complete.IsZero() {
			s.Warning = unknownComplete
		} else {
			complete = complete.UTC()
			s.CompleteAsOf = &complete
		}
		err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			s.Files++
			s.Bytes += info.Size()
			return nil
		})
		if err != nil {
			log.Error("snapshot written, but not readable", "dir", dir, "err", err)
			plain(w, http.StatusInternalServerError, fmt.Sprintf("snapshot written to %q, but reading it back failed: %v", dir, err))
			return
		}
		log.Info("snapshot written", "dir", dir, "files", s.Files, "bytes", s.Bytes, "duration", time.Since(start))
		writeJSON(w, http.StatusOK, s)
	})
}

// snapshotTarget is the directory a snapshot request's dir names inside
// root, or the status and one-line reason it is refused with; a reason
// quotes dir and the paths made from it (%q), so that what a client sent
// cannot break the line. root is absolute and clean; it need not exist
// yet. A dir with a control character is refused first: no directory
// worth a snapshot is named so.
//
// The checks are made on the path as it is on disk now. Between them and
// the checkpoint, only a process that can write inside root (the node's
// own user: root is 0700) could put a symbolic link in the way.
func snapshotTarget(root, dir string) (target string, code int, why string) {
	bad := func(format string, args ...any) (string, int, string) {
		return "", http.StatusBadRequest, fmt.Sprintf("dir %q: ", dir) + fmt.Sprintf(format, args...)
	}
	if dir == "" {
		return "", http.StatusBadRequest, "missing dir parameter: the new directory to write the snapshot to, inside --snapshot-dir " + root
	}
	if strings.ContainsFunc(dir, unicode.IsControl) {
		return bad("contains a control character: name a directory inside --snapshot-dir %s", root)
	}
	if slices.Contains(strings.Split(filepath.ToSlash(dir), "/"), "..") {
		return bad("must not contain ..: snapshots stay inside --snapshot-dir %s", root)
	}
	rel := filepath.Clean(dir)
	if filepath.IsAbs(rel) {
		var err error
		if rel, err = filepath.Rel(root, rel); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return bad("outside --snapshot-dir %s: give a path inside it, or one relative to it", root)
		}
	}
	if rel == "." {
		return bad("is --snapshot-dir %s itself: a snapshot goes to a new directory inside it", root)
	}
	// Every directory from root down that exists already: a real
	// directory, never a link (which could lead anywhere).
	target = filepath.Join(root, rel)
	parts := strings.Split(rel, string(filepath.Separator))
	// A name the filesystem cannot hold is the request's fault, not a
	// failed checkpoint's (500, after making the parents that fit).
	// The reason does not quote dir, which may be kilobytes long.
	for i, p := range parts {
		most := nameMax
		if i == len(parts)-1 {
			most -= partialNameRoom // the copy is made in a sibling named after it
		}
		if len(p) > most {
			return "", http.StatusBadRequest, fmt.Sprintf("dir of %d bytes: a name in it of %d bytes is too long (at most %d)", len(dir), len(p), most)
		}
	}
	if len(target)+partialNameRoom > pathMax-checkpointNameRoom {
		return "", http.StatusBadRequest, fmt.Sprintf("dir of %d bytes: too long, the snapshot's path inside --snapshot-dir would be %d bytes (at most %d)",
			len(dir), len(target), pathMax-checkpointNameRoom-partialNameRoom)
	}
	at := root
	for i, p := range parts {
		at = filepath.Join(at, p)
		info, err := os.Lstat(at)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return target, 0, "" // it and the rest are made by the checkpoint
		case err != nil:
			return bad("%v", err)
		case info.Mode()&fs.ModeSymlink != 0:
			return bad("%q is a symbolic link: snapshots stay inside --snapshot-dir %s", at, root)
		case i == len(parts)-1:
			return "", http.StatusConflict, fmt.Sprintf("dir %q already exists: a snapshot goes to a new directory", dir)
		case !info.IsDir():
			return bad("%q is not a directory", at)
		}
	}
	return target, 0, "" // not reached: the last part exists or not
}
