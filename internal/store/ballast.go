package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

// BallastFile is the name of the emergency ballast in the data directory:
// a file of --ballast-size bytes that holds space in reserve (after
// CockroachDB's EMERGENCY_BALLAST). Deleting it gives that space back at
// once: to Pebble, to compact or flush, or to start on a disk that
// filled. The store deletes it itself when Pebble meets ENOSPC (Open's
// vfs.OnDiskFull), so that the write Pebble retries can succeed; it is
// made again at the next start when the volume has room for it. Pebble
// ignores files it did not name.
const BallastFile = "EMERGENCY_BALLAST"

// maxPercentBallast caps a ballast given as a percentage of the volume:
// 1% of a large volume is more than any recovery needs.
const maxPercentBallast = 1 << 30

// ballastBytes is the size of the ballast a volume of total bytes gets.
func ballastBytes(a sizeflag.Amount, total uint64) uint64 {
	n := a.Of(total)
	if a.Percent > 0 {
		n = min(n, maxPercentBallast)
	}
	return n
}

// ballastPath is the ballast's path in the store's directory.
func (s *Store) ballastPath() string { return s.fs.PathJoin(s.dir, BallastFile) }

// ballastSize is the size of the ballast file, 0 if there is none.
func (s *Store) ballastSize() uint64 {
	fi, err := s.fs.Stat(s.ballastPath())
	if err != nil {
		return 0
	}
	return uint64(fi.Size())
}

// ensureBallast makes the ballast file want bytes long, at start-up. A
// ballast of another size is removed first; none is made (a warning
// says why) where the volume's free space would be left below the
// space guard's resume threshold: the ballast must not be what fills the
// disk. want 0 removes any ballast. Its errors are not the store's: a
// node runs without a ballast.
func (s *Store) ensureBallast(want uint64, r *spaceReading) error {
	path := s.ballastPath()
	have := s.ballastSize()
	if have == want {
		return nil
	}
	if have > 0 {
		if err := s.fs.Remove(path); err != nil {
			return fmt.Errorf("remove ballast %s of %d bytes: %w", path, have, err)
		}
	}
	if want == 0 {
		return nil
	}
	if !r.known {
		return nil // no volume to size it against, nor to guard (a test's MemFS)
	}
	if free := r.free + have; free < want || free-want < r.resume {
		s.log.Warn("emergency ballast not made: the volume has too little free space",
			"path", path, "ballast_bytes", want, "free", free, "min_free", r.min)
		return nil
	}
	if err := s.makeBallast(path, want); err != nil {
		_ = s.fs.Remove(path)
		return fmt.Errorf("make ballast %s of %d bytes: %w", path, want, err)
	}
	s.log.Info("emergency ballast made: delete it to free its space at once when the disk is full (docs/storage.md)",
		"path", path, "bytes", want)
	return nil
}

// makeBallast writes a file of n bytes at path: allocated at once where
// the operating system's file system allows (allocate), zeros otherwise.
func (s *Store) makeBallast(path string, n uint64) error {
	if s.fs == vfs.Default {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		err = allocate(f, int64(n))
		if errors.Is(err, errAllocateUnsupported) {
			err = writeZeros(f, n)
		}
		return errors.Join(err, f.Sync(), f.Close())
	}
	f, err := s.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	return errors.Join(writeZeros(f, n), f.Sync(), f.Close())
}

// errAllocateUnsupported: allocate cannot allocate on this system or
// file system; zeros are written instead.
var errAllocateUnsupported = errors.New("allocation unsupported")

// writeZeros writes n zero bytes to w, a MiB at a time.
func writeZeros(w interface{ Write([]byte) (int, error) }, n uint64) error {
	zeros := make([]byte, min(n, 1<<20))
	for n > 0 {
		k := min(n, uint64(len(zeros)))
		if _, err := w.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// removeBallast deletes the ballast, from within Pebble's disk-full
// callback (it must be quick, and must not write through the FS Pebble
// writes through, which is blocked meanwhile), and returns the bytes it
// freed.
func (s *Store) removeBallast() uint64 {
	n := s.ballastSize()
	if n == 0 {
		return 0
	}
	if err := s.fs.Remove(s.ballastPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error("remove the emergency ballast", "path", s.ballastPath(), "err", err)
		return 0
	}
	return n
}
