package admin

import (
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/client"
)

// Checkpointer makes a consistent copy of a node's store: everything its
// data directory holds (records, hints, the anti-entropy index, the
// directory's identity, the clock bound) as of one instant, written to
// dir, which must not exist (its parents are created). A node started on
// the copy as its data directory is the node as it was at that instant.
// The store implements it with Pebble's DB.Checkpoint, which hard-links
// sstables when dir is on the same filesystem and copies them otherwise.
type Checkpointer interface {
	Checkpoint(dir string) error
}

// SnapshotHandler serves the backup trigger:
//
//	POST /snapshot?dir=PATH   checkpoint the store into PATH; answer when
//	                          done, with a client.Snapshot
//
// PATH is on the node's machine: absolute, and not yet existing. The
// answers: 200 and the JSON; 400 for a missing or relative dir; 409 when
// dir exists or another snapshot is running (one at a time: each pins the
// store's files while it copies); 405 for another method; 501 when cp is
// nil (the node's store cannot checkpoint); 500 when the checkpoint
// failed (nothing is left in dir). The request is checked before cp, so
// its rules hold whatever the store.
func SnapshotHandler(cp Checkpointer, log *slog.Logger) http.Handler {
	var running sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			plain(w, http.StatusMethodNotAllowed, "method not allowed: use POST")
			return
		}
		dir := r.URL.Query().Get("dir")
		switch _, err := os.Lstat(dir); {
		case dir == "":
			plain(w, http.StatusBadRequest, "missing dir parameter: the directory to write the snapshot to")
			return
		case !filepath.IsAbs(dir):
			plain(w, http.StatusBadRequest, "dir "+dir+" is not an absolute path")
			return
		case err == nil:
			plain(w, http.StatusConflict, "dir "+dir+" already exists: a snapshot goes to a new directory")
			return
		case !errors.Is(err, fs.ErrNotExist):
			plain(w, http.StatusBadRequest, "dir "+dir+": "+err.Error())
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
		dir = filepath.Clean(dir)
		start := time.Now()
		if err := cp.Checkpoint(dir); err != nil {
			log.Error("snapshot failed", "dir", dir, "err", err)
			plain(w, http.StatusInternalServerError, "snapshot failed: "+err.Error())
			return
		}
		s := client.Snapshot{Dir: dir, DurationSeconds: time.Since(start).Seconds()}
		err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
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
			plain(w, http.StatusInternalServerError, "snapshot written to "+dir+", but reading it back failed: "+err.Error())
			return
		}
		log.Info("snapshot written", "dir", dir, "files", s.Files, "bytes", s.Bytes, "duration", time.Since(start))
		writeJSON(w, http.StatusOK, s)
	})
}
