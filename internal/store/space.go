package store

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/dustin/go-humanize"

	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

// The space guard
//
// A disk that fills under Pebble is an outage: an ENOSPC on the WAL is a
// fatal commit error (health.go), and a store reopened on a full disk
// cannot create its new WAL and MANIFEST. So the store stops taking the
// writes that grow it (records, hints) while its data volume has less
// than --min-free-space free, well before Pebble meets ENOSPC, and leaves
// that room to what must still write: flushes of the memtables already
// written, compactions, the small control writes (clock bound, cluster
// map, identity), deletions by garbage collection and partition drops.
// Writes resume once free space is back above the threshold by a quarter
// of it (hysteresis, so that a compaction's transient files do not make
// it flap), without a restart.
//
// No goroutine polls: free space is read (statfs, or Options.StatFS) by
// the first write, status or scrape that finds the last reading older
// than Options.SpaceCheckInterval, and by a write that the reading, less
// the bytes written since, would take below the threshold. A write that
// finds the volume full therefore reads it again at most once an
// interval, and one that finds space back resumes writing.

// spaceReading is one reading of the data volume's space and what the
// guard made of it. Readings are immutable once published.
type spaceReading struct {
	at          time.Time
	known       bool   // the volume answered
	err         error  // why it did not, when that is worth a warning
	free, total uint64 // available to the node, and the volume's size
	min, resume uint64 // below min writes stop; at resume they go on
	full        bool
	// refusal is what a write gets while full.
	refusal error
}

// spaceGuard is the free-space guard (see above). A nil guard refuses
// nothing and knows nothing.
type spaceGuard struct {
	dir    string
	statfs func(string) (vfs.DiskUsage, error)
	min    sizeflag.Amount
	every  time.Duration
	log    *slog.Logger

	mu      sync.Mutex // one reading at a time
	cur     atomic.Pointer[spaceReading]
	written atomic.Int64 // bytes admitted since cur was read
}

func newSpaceGuard(dir string, statfs func(string) (vfs.DiskUsage, error), min sizeflag.Amount, every time.Duration, log *slog.Logger) *spaceGuard {
	g := &spaceGuard{dir: dir, statfs: statfs, min: min, every: every, log: log}
	g.cur.Store(&spaceReading{}) // unknown, read at the first use
	return g
}

// resumeAt is the free space at which a full volume takes writes again:
// the threshold plus a quarter of it.
func resumeAt(min uint64) uint64 { return min + min/4 }

// admit reports whether a write of about n bytes may go to the store
// now: nil, or the refusal (wrapping ErrInsufficientStorage) while the
// volume is below the threshold. A volume that cannot be read refuses
// nothing.
func (g *spaceGuard) admit(n int) error {
	if g == nil {
		return nil
	}
	r := g.cur.Load()
	if time.Since(r.at) >= g.every ||
		r.known && !r.full && int64(r.free)-g.written.Load()-int64(n) < int64(r.min) {
		r = g.read()
	}
	if r.full {
		return r.refusal
	}
	g.written.Add(int64(n))
	return nil
}

// reading returns the current reading, read again if it is older than
// the interval.
func (g *spaceGuard) reading() *spaceReading {
	r := g.cur.Load()
	if time.Since(r.at) >= g.every {
		r = g.read()
	}
	return r
}

// read takes a new reading and publishes it; a reading under way
// elsewhere is waited for and used instead.
func (g *spaceGuard) read() *spaceReading {
	before := g.cur.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := g.cur.Load(); r != before {
		return r // read meanwhile
	}
	du, err := g.statfs(g.dir)
	r := &spaceReading{at: time.Now()}
	switch {
	case errors.Is(err, vfs.ErrUnsupported):
		// A file system without statfs (a test's MemFS): no guard.
	case err != nil:
		r.err = fmt.Errorf("free space of %s: %w", g.dir, err)
	default:
		r.known, r.free, r.total = true, du.AvailBytes, du.TotalBytes
		r.min = g.min.Of(du.TotalBytes)
		r.resume = resumeAt(r.min)
		if before.full {
			r.full = r.free < r.resume
		} else {
			r.full = r.free < r.min
		}
	}
	if r.full {
		r.refusal = &Refusal{fmt.Errorf("%w: the data volume has %s free of %s, below --min-free-space %s (%s): writes are refused until %s are free",
			ErrInsufficientStorage, iBytes(r.free), iBytes(r.total), g.min, iBytes(r.min), iBytes(r.resume))}
	}
	g.written.Store(0)
	g.cur.Store(r)
	switch {
	case r.full && !before.full:
		g.log.Warn("disk full: writes refused", "dir", g.dir, "free", r.free, "total", r.total, "min_free", r.min, "resume_at", r.resume)
	case !r.full && before.full:
		g.log.Info("disk space back: writes resume", "dir", g.dir, "free", r.free, "total", r.total, "min_free", r.min)
	}
	if r.err != nil && before.err == nil {
		g.log.Warn("cannot read the data volume's free space: writes are not guarded", "err", r.err)
	}
	return r
}

// markFull makes the guard refuse writes from now on, until a reading
// finds the volume above the resume threshold: Pebble met ENOSPC, so the
// volume is full whatever the last reading said.
func (g *spaceGuard) markFull(why string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r := *g.cur.Load()
	r.at = time.Now()
	r.full = true
	r.refusal = &Refusal{fmt.Errorf("%w: the data volume is full (%s): writes are refused until %s are free",
		ErrInsufficientStorage, why, iBytes(r.resume))}
	g.cur.Store(&r)
}

// iBytes prints n in binary units for a reason line: "3.1 MiB".
func iBytes(n uint64) string { return humanize.IBytes(n) }

// Space is the data volume as the store last read it.
type Space struct {
	// Dir is the store's directory.
	Dir string
	// Known: the volume's space could be read. A file system without
	// statfs (a test's MemFS) is not guarded, and Err says why another
	// could not be read.
	Known bool
	Err   error
	// Free and Total are the bytes available to the node and the
	// volume's size; MinFree is --min-free-space of this volume, and
	// ResumeAt the free space at which a full volume takes writes again.
	Free, Total, MinFree, ResumeAt uint64
	// Full: writes are refused for want of space (Refusal says so).
	Full    bool
	Refusal error
	// Ballast is the emergency ballast's path, and BallastBytes its size
	// (0: there is none now).
	Ballast      string
	BallastBytes uint64
}

// Space returns the data volume's space, read again if the last reading
// is older than Options.SpaceCheckInterval.
func (s *Store) Space() Space {
	r := s.guard.reading()
	return Space{
		Dir: s.dir, Known: r.known, Err: r.err,
		Free: r.free, Total: r.total, MinFree: r.min, ResumeAt: r.resume,
		Full: r.full, Refusal: r.refusal,
		Ballast: s.ballastPath(), BallastBytes: s.ballastSize(),
	}
}

// Warnings are what an operator must know about the store, one line each:
// it failed a write, its volume is full (and how to free space at once),
// its volume's space cannot be read.
func (s *Store) Warnings() []string {
	var ws []string
	if f := s.health.failed.Load(); f != nil {
		ws = append(ws, fmt.Sprintf("store failed a write (%v): PUT and DELETE answer 507 and /readyz 503 until the node is restarted; reads are served (docs/storage.md)",
			f.cause))
	}
	sp := s.Space()
	switch {
	case sp.Full && sp.BallastBytes > 0:
		ws = append(ws, fmt.Sprintf("disk full: %v; deleting the emergency ballast %s frees %s at once",
			sp.Refusal, sp.Ballast, iBytes(sp.BallastBytes)))
	case sp.Full:
		ws = append(ws, fmt.Sprintf("disk full: %v; the emergency ballast is spent (made again at the next start when there is room)", sp.Refusal))
	case sp.Err != nil:
		ws = append(ws, fmt.Sprintf("free space unknown, writes not guarded: %v", sp.Err))
	}
	return ws
}
