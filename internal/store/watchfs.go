package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// watchFS is the file system Pebble writes through: it passes every
// operation on, and tells onError of a write or sync that failed, as it
// fails, on the goroutine that met it. Pebble's own reaction comes later
// or never where it matters: its WAL writer keeps a write error to itself
// until a commit waits for a sync, or until the next block is queued
// (with --sync=false, many commits later), and a memtable rotation that
// then meets it panics in a way no one can recover (an unlock of an
// unlocked mutex, db.go's rotateWAL). Failing the store at the first
// error stops the commits before they reach Pebble (Store.write).
//
// It sits outside vfs.OnDiskFull, so an ENOSPC it sees is one the
// ballast could not cure.
type watchFS struct {
	vfs.FS
	onError func(path string, err error)
	// raw is the store's file system unwrapped, and dir its directory:
	// files outside dir (a checkpoint's copy) are written through raw,
	// so that their errors are neither the store's nor its volume's.
	raw vfs.FS
	dir string
}

// outside reports whether name is not in the store's directory.
func (fs watchFS) outside(name string) bool {
	if fs.raw == nil {
		return false
	}
	name = filepath.Clean(name)
	return name != fs.dir && filepath.Dir(name) != fs.dir
}

func (fs watchFS) watch(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		fs.onError(name, err)
		return f, err
	}
	return watchFile{File: f, name: name, fs: fs}, nil
}

func (fs watchFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if fs.outside(name) {
		return fs.raw.Create(name, category)
	}
	f, err := fs.FS.Create(name, category)
	return fs.watch(name, f, err)
}

func (fs watchFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	if fs.outside(name) {
		return fs.raw.OpenReadWrite(name, category, opts...)
	}
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	return fs.watch(name, f, err)
}

func (fs watchFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.watch(newname, f, err)
}

// OpenDir's directory is synced after files are made in it.
func (fs watchFS) OpenDir(name string) (vfs.File, error) {
	if fs.outside(name) {
		return fs.raw.OpenDir(name)
	}
	f, err := fs.FS.OpenDir(name)
	if err != nil {
		return f, err // reading: nothing failed to reach the disk
	}
	return watchFile{File: f, name: name, fs: fs}, nil
}

func (fs watchFS) Unwrap() vfs.FS { return fs.FS }

// watchFile reports its failed writes and syncs.
type watchFile struct {
	vfs.File
	name string
	fs   watchFS
}

func (f watchFile) failed(err error) error {
	if err != nil {
		f.fs.onError(f.name, err)
	}
	return err
}

func (f watchFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	return n, f.failed(err)
}

func (f watchFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	return n, f.failed(err)
}

func (f watchFile) Sync() error     { return f.failed(f.File.Sync()) }
func (f watchFile) SyncData() error { return f.failed(f.File.SyncData()) }

func (f watchFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	return full, f.failed(err)
}

// fileError handles a write or sync of Pebble's that failed on path. The
// WAL's, the MANIFEST's, its markers' and the directory's are fatal to
// Pebble, and fail the store now; an sstable's (a flush or compaction
// output) Pebble retries, so it fails the store only if it is the disk
// failing (EIO), not the disk full (ENOSPC: onDiskFull ran, the space
// guard refuses writes).
func (s *Store) fileError(path string, err error) {
	base := s.fs.PathBase(path)
	fatal := path == s.dir || strings.HasSuffix(base, ".log") ||
		strings.HasPrefix(base, "MANIFEST") || strings.HasPrefix(base, "marker.")
	if fatal || errors.Is(err, syscall.EIO) {
		s.fail(fmt.Errorf("%s: %w", path, err))
	}
}
