package store

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrInsufficientStorage refuses a write the store cannot take now: its
// data volume is below --min-free-space (space.go), or the store failed
// a write (ErrStoreFailed). Nothing of the refused write was stored. The
// node answers it 507 Insufficient Storage, and a replica's refusal counts
// as no answer, so its coordinator keeps a hint (within the hints' own
// bounds) and finds ack among the other replicas.
var ErrInsufficientStorage = errors.New("insufficient storage")

// Refusal is a write the store refused: an error wrapping
// ErrInsufficientStorage, whose text is the one-line reason, as a client
// or another node is told it. Callers wrap it in their context; errors.As
// finds it again (Reason).
type Refusal struct{ err error }

func (r *Refusal) Error() string { return r.err.Error() }
func (r *Refusal) Unwrap() error { return r.err }

// Reason is the one-line reason of the refusal within err, without the
// context callers wrapped it in, or err's text if it holds none; only
// its first line, should a cause it quotes have more.
func Reason(err error) string {
	msg := err.Error()
	var r *Refusal
	if errors.As(err, &r) {
		msg = r.Error()
	}
	line, _, _ := strings.Cut(msg, "\n")
	return line
}

// ErrStoreFailed is why a store that failed a write refuses every write
// since (Failure): Pebble treats an error writing or syncing its WAL or
// MANIFEST as fatal, and the database it leaves cannot be written again
// (docs/storage.md, "A failing disk"). Reads are served; a restart
// reopens the store on what reached the disk.
var ErrStoreFailed = errors.New("the store failed a write and takes none until the node restarts")

// health is the store's failure state: once failed, it stays failed for
// the life of the Store.
type health struct {
	// failed is set once a write failed (nil before).
	failed atomic.Pointer[failure]
	// failedCh is closed once failed is set.
	failedCh chan struct{}
	// refusedFull and refusedFailed count the writes refused, by reason.
	refusedFull, refusedFailed atomic.Uint64
	// background counts Pebble's background errors (a flush or a
	// compaction that failed, and is retried).
	background atomic.Uint64
	// lastBackgroundLog is when a background error was last logged (Unix
	// ns): Pebble retries a failed compaction at once, and on a full disk
	// it would log each try.
	lastBackgroundLog atomic.Int64
	suppressed        atomic.Uint64
}

// failure is a store's failure: the first write error, and the refusal
// every write gets from then on, which wraps ErrInsufficientStorage,
// ErrStoreFailed and the cause.
type failure struct{ cause, refusal error }

// Failure returns why the store takes no writes any more (the refusal
// writes get: an error wrapping ErrInsufficientStorage, ErrStoreFailed and
// the first write error), or nil while it works.
func (s *Store) Failure() error {
	if f := s.health.failed.Load(); f != nil {
		return f.refusal
	}
	return nil
}

// fail records cause as the store's failure, if it is the first, and
// returns the refusal that every write gets from now on. It logs the
// first failure, with what the operator sees and does.
func (s *Store) fail(cause error) error {
	f := &failure{cause: cause, refusal: &Refusal{fmt.Errorf("%w: %w: %w", ErrInsufficientStorage, ErrStoreFailed, cause)}}
	if s.health.failed.CompareAndSwap(nil, f) {
		close(s.health.failedCh)
		s.log.Error("the store failed a write: writes are refused from now on (507), reads are served, /readyz answers 503; "+
			"restart the node once the disk is sound (docs/storage.md)", "dir", s.dir, "err", cause)
		return f.refusal
	}
	return s.health.failed.Load().refusal
}

// write runs fn, a write to Pebble, unless the store failed (then it
// returns the refusal, without calling Pebble: after a failed commit
// Pebble's commit pipeline can block every later commit). A panic out of
// fn, which Pebble raises on the committing goroutine when a WAL write or
// sync fails (its "fatal commit error", through Options.Logger.Fatalf,
// or a panic of the WAL's error as such), fails the store and returns as
// its refusal: the write was not acknowledged.
func (s *Store) write(fn func() error) (err error) {
	if f := s.health.failed.Load(); f != nil {
		s.health.refusedFailed.Add(1)
		return f.refusal
	}
	defer func() {
		if r := recover(); r != nil {
			var cause error
			switch v := r.(type) {
			case fatalError:
				cause = v.err
			case error:
				cause = fmt.Errorf("pebble panicked: %w", v)
			default:
				cause = fmt.Errorf("pebble panicked: %v", v)
			}
			err = s.fail(cause)
		}
	}()
	return fn()
}

// backgroundError handles an error of Pebble's background work (a
// flush, a compaction): Pebble retries the work, so it is logged (once
// per backgroundLogEvery, with how many were not) and counted. An I/O
// error (EIO) is the disk failing, and fails the store; running out of
// space (ENOSPC) is the space guard's (space.go), which already knows.
func (s *Store) backgroundError(log *slog.Logger, err error) {
	s.health.background.Add(1)
	if errors.Is(err, syscall.EIO) {
		s.fail(fmt.Errorf("background write: %w", err))
	}
	now := time.Now().UnixNano()
	last := s.health.lastBackgroundLog.Load()
	if now-last < int64(backgroundLogEvery) || !s.health.lastBackgroundLog.CompareAndSwap(last, now) {
		s.health.suppressed.Add(1)
		return
	}
	log.Error("background error", "err", err, "dir", s.dir, "not_logged_since", s.health.suppressed.Swap(0))
}

// backgroundLogEvery is the least time between two logged background
// errors.
const backgroundLogEvery = 10 * time.Second

// fatalMessage is what Pebble's Fatalf said, and the error it said it
// about.
type fatalMessage struct {
	msg   string
	cause error
}

func (e fatalMessage) Error() string { return e.msg }
func (e fatalMessage) Unwrap() error { return e.cause }

// fatalError is the panic of slogLogger.Fatalf on a goroutine that can
// take it (see there): Store.write and Open recover it.
type fatalError struct{ err error }

// fatalCommitFormat is the format of Pebble's Fatalf when a commit
// failed (DB.applyInternal, on the committing goroutine).
const fatalCommitFormat = "pebble: fatal commit error: %v"

// slogLogger is Pebble's logger: Infof at debug level, Errorf at error
// level, and Fatalf, which Pebble calls for what it cannot go on from.
type slogLogger struct {
	l *slog.Logger
	// fail records a fatal error as the store's failure (Store.fail).
	fail func(error) error
	// opening reports whether the store is being opened: Pebble's
	// Fatalf then runs on Open's goroutine.
	opening func() bool
}

func (l slogLogger) Infof(format string, args ...any) { l.l.Debug(fmt.Sprintf(format, args...)) }
func (l slogLogger) Errorf(format string, args ...any) {
	l.l.Error(fmt.Sprintf(format, args...))
}

// Fatalf never returns: Pebble's code after it assumes the process ended,
// and goes on from state it did not unwind (a commit reported applied, a
// version's reference counts), so returning could acknowledge a write
// that is not durable, or let it delete files still in use. Nor does it
// end the process. It records the failure (every write is refused from
// then on), then:
//
//   - on the goroutine of a commit (Pebble's "fatal commit error"), or
//     on any goroutine while the store opens, it panics with a
//     fatalError, which Store.write and Open recover: that write, or the
//     Open, fails with the error (a panic on a goroutine of Pebble's own
//     during Open, which nothing recovers, ends the process: the node
//     fails to start, as it would by Open's error);
//   - on any other goroutine, one of Pebble's own (a flush or compaction
//     whose MANIFEST write failed), it parks the goroutine for good. Locks
//     it holds stay held: flushes and compactions stop, and so would
//     anything else waiting on the database's mutex (the store no longer
//     reads Pebble's metrics, checkpoints or closes it unbounded once
//     failed). Reads take no such lock and go on.
func (l slogLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.l.Error(msg)
	err := fatalMessage{msg: msg}
	for _, a := range args {
		if e, ok := a.(error); ok {
			err.cause = e // the error it reports, for errors.Is
			break
		}
	}
	if l.fail != nil {
		l.fail(err)
	}
	if format == fatalCommitFormat || l.opening != nil && l.opening() {
		panic(fatalError{err})
	}
	select {}
}
