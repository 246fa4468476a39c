package scan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// Format is how a response body frames its records.
type Format int

const (
	// FormatChunks is the default framing: one HTTP chunk per live record
	// whose content is key '\n' value.
	FormatChunks Format = iota
	// FormatBinary is the binary framing (package framing) of the live records.
	FormatBinary
	// FormatJSON is JSON lines (framing.AppendJSON) of the live records:
	// one object per record and line, no end marker.
	FormatJSON
	// FormatInternal is the binary framing of every record, tombstones
	// included, with record envelopes as values: the internal endpoint.
	FormatInternal
)

// Abort reasons, the label values of dhtkv_scan_aborts_total.
const (
	AbortClientGone    = "client_gone"    // a write to the client failed
	AbortClientTimeout = "client_timeout" // the client read nothing for the idle timeout
	AbortSourceError   = "source_error"   // the store or another node failed
	AbortShutdown      = "shutdown"       // the node is stopping
)

// ErrShutdown aborts streams of a node that is stopping.
var ErrShutdown = errors.New("node shutting down")

// BodyOptions configures a Body.
type BodyOptions struct {
	// FlushBytes is the batch size of the binary framings: records are
	// collected up to this many bytes and handed to the connection in one
	// write (one HTTP chunk, one flush).
	FlushBytes int
	// Ctx, when done, aborts the stream (node shutdown).
	Ctx context.Context
	// BeforeWrite runs before every write of n bytes to the connection;
	// the handler uses it to push the connection's write deadline
	// forward, so the deadline bounds how long the client may take over
	// this piece, not the whole scan.
	BeforeWrite func(n int) error
	// OnClose runs once when the body is closed (the handler unregisters
	// the stream).
	OnClose func()
	Metrics *Metrics // nil: not counted
	Log     *slog.Logger
	// Name identifies the stream in logs.
	Name string
	// Limit, when positive, ends the stream after this many records, as if
	// the range ended there: the binary framing's end marker counts them,
	// and the iterator is not advanced past the last one. The public
	// framings count live records only, the internal one every record.
	// 0: no limit.
	Limit uint64
	// Now is the time expiry is judged at in the public framings (records
	// expired then are left out, like tombstones); default: when the body
	// is made. The internal framing carries every record as stored.
	Now time.Time
	// ReleaseAfter, when positive and the iterator is a Releaser, releases
	// the iterator when a write to the connection has not returned after
	// this long: the client is not reading, and the stream should not pin
	// the store's snapshot meanwhile. The next record comes from a new
	// snapshot, just after the last key sent (see Releaser). 0: never.
	ReleaseAfter time.Duration
}

// Body is a response body that pulls records from an Iterator only as fast
// as the connection accepts them.
//
// It is handed to fasthttp with Response.SetBodyStream(body, -1) and
// implements fasthttp.BodyWriterTo, so fasthttp calls WriteTo on the
// connection's own goroutine with a writer that turns every Write into one
// HTTP chunk and flushes it to the socket. The consequences, which are the
// design (docs/range-scans.md has the reading of fasthttp's source):
//
//   - flow control is the socket's: Write blocks while the client is not
//     reading, so the iterator does not advance; nothing piles up in
//     between, there is no goroutine and no pipe; and once a Write has
//     blocked for ReleaseAfter, the iterator is released (stallRelease),
//     so a stalled client pins no store snapshot;
//   - chunk boundaries are ours: FormatChunks writes one record per chunk,
//     as FormatChunks requires;
//   - an error return from WriteTo makes fasthttp close the connection
//     without the terminating zero-length chunk, which the client sees as
//     a truncated body, never as a complete one.
type Body struct {
	it     Iterator
	format Format
	o      BodyOptions

	buf     []byte
	n       uint64 // records produced
	counted uint64 // records already added to metrics
	done    bool   // end reached (and, for the binary framings, marker produced)

	// jsonOff is how much of the value of the JSON record under way
	// (jsonMore) is written: the rest goes in pieces of about FlushBytes
	// (framing.AppendJSONValuePart), never escaped whole. The value is
	// read again from the iterator for each piece: a stalled write's
	// Release (stallRelease, between two pieces) gives back the memory
	// the record aliased, and the iterator then holds its own copy.
	jsonOff  int
	jsonMore bool

	pending []byte // Read's leftovers
	pendErr error

	finished bool   // WriteTo or Read reached the end without error
	reason   string // abort reason, "" while none
	closed   bool

	stall *stallRelease // nil: the iterator is never released
}

// NewBody streams it in format f. The Body owns it and closes it.
func NewBody(it Iterator, f Format, o BodyOptions) *Body {
	if o.FlushBytes <= 0 {
		o.FlushBytes = 64 << 10
	}
	if o.Ctx == nil {
		o.Ctx = context.Background()
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	b := &Body{it: it, format: f, o: o}
	if r, ok := it.(Releaser); ok && o.ReleaseAfter > 0 {
		b.stall = &stallRelease{after: o.ReleaseAfter, r: r, b: b}
	}
	return b
}

// SupportsBodyWriteTo tells fasthttp that WriteTo may replace Read.
func (b *Body) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the whole stream to w, one piece per Write.
func (b *Body) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		piece, err := b.step()
		if len(piece) > 0 {
			if b.o.BeforeWrite != nil {
				if derr := b.o.BeforeWrite(len(piece)); derr != nil {
					return total, b.writeFailed(derr)
				}
			}
			n, werr := b.write(w, piece)
			total += int64(n)
			if werr != nil {
				return total, b.writeFailed(werr)
			}
			b.count()
			if rerr := b.stall.failed(); rerr != nil {
				return total, b.abort(AbortSourceError, rerr)
			}
		}
		if err == io.EOF {
			b.finished = true
			return total, nil
		}
		if err != nil {
			return total, err // step already recorded the abort
		}
	}
}

// write writes one piece; with a stallRelease, the iterator is released
// should the write block for longer than ReleaseAfter.
func (b *Body) write(w io.Writer, piece []byte) (int, error) {
	if b.stall == nil {
		return w.Write(piece)
	}
	b.stall.begin()
	n, err := w.Write(piece)
	b.stall.end()
	return n, err
}

// stallRelease releases a Body's iterator while a write to the client is
// blocked: a timer armed for every write fires on its own goroutine, and
// releases the iterator if that write is still running after the
// threshold. The writing goroutine does not touch the iterator while it
// writes (the piece is a copy, see step), and mu orders the release
// before the next Next, so the iterator is never used by two goroutines
// at once. A write that takes longer than the threshold costs one release
// and one reopen; one that returns sooner costs a Reset and a Stop of the
// timer.
type stallRelease struct {
	after time.Duration
	r     Releaser
	b     *Body // for metrics and logs

	timer *time.Timer // created by the first write

	mu     sync.Mutex
	since  time.Time // when the write in progress began; zero between writes
	closed bool      // the Body was closed: nothing more to release
	err    error     // the release's error, for the writing goroutine
}

// begin arms the timer for a write starting now.
func (s *stallRelease) begin() {
	s.mu.Lock()
	s.since = time.Now()
	s.mu.Unlock()
	if s.timer == nil {
		s.timer = time.AfterFunc(s.after, s.fire)
	} else {
		s.timer.Reset(s.after)
	}
}

// end disarms it once the write returned.
func (s *stallRelease) end() {
	s.timer.Stop()
	s.mu.Lock()
	s.since = time.Time{}
	s.mu.Unlock()
}

// fire runs on the timer's goroutine. It releases the iterator if a write
// has been running for the threshold: a timer that fires late, after its
// write returned or for an earlier write, finds since zero or recent and
// does nothing.
func (s *stallRelease) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.since.IsZero() || time.Since(s.since) < s.after {
		return
	}
	if err := s.r.Release(); err != nil {
		s.err = fmt.Errorf("release the iterator of a stalled stream: %w", err)
		return
	}
	if s.b.o.Metrics != nil {
		s.b.o.Metrics.Releases.Inc()
	}
	s.b.o.Log.Debug("range stream released its iterator: the client is not reading",
		"stream", s.b.o.Name, "records", s.b.n, "after", s.after)
}

// failed returns (once) the error of a release that failed; nil on a nil
// stallRelease.
func (s *stallRelease) failed() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// close stops any release to come; the Body closes the iterator next.
func (s *stallRelease) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
}

// writeFailed classifies a failed write to the connection.
func (b *Body) writeFailed(err error) error {
	switch {
	case b.o.Ctx.Err() != nil:
		// Server.Close closed the connection under us.
		return b.abort(AbortShutdown, fmt.Errorf("%w: %w", ErrShutdown, err))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return b.abort(AbortClientTimeout, err)
	default:
		return b.abort(AbortClientGone, err)
	}
}

// Read is the io.Reader fallback (fasthttp uses WriteTo). It loses the
// one-record-per-chunk property of FormatChunks, since the reader decides
// the chunk sizes, and never releases the iterator: the writes are the
// reader's.
func (b *Body) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.pendErr != nil {
			if b.pendErr == io.EOF {
				b.finished = true
			}
			return 0, b.pendErr
		}
		b.pending, b.pendErr = b.step()
		b.count()
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// step produces the next piece: one record for FormatChunks, a batch of up
// to FlushBytes for the others. It returns io.EOF with the last piece,
// once the iterator is exhausted or Limit records were produced.
func (b *Body) step() ([]byte, error) {
	if b.done {
		return nil, io.EOF
	}
	if b.reason != "" {
		return nil, fmt.Errorf("scan %s: already aborted (%s)", b.o.Name, b.reason)
	}
	b.buf = b.buf[:0]
	done := b.o.Ctx.Done()
	for {
		select { // a non-blocking receive: no lock per record
		case <-done:
			return nil, b.abort(AbortShutdown, ErrShutdown)
		default:
		}
		if b.jsonMore {
			value := b.it.Record().Value
			var rest []byte
			var done bool
			// Escaped, a byte takes up to 6.
			b.buf, rest, done = framing.AppendJSONValuePart(b.buf, value[b.jsonOff:], b.o.FlushBytes/6)
			b.jsonOff = len(value) - len(rest)
			if done {
				b.jsonOff, b.jsonMore = 0, false
			}
			if len(b.buf) >= b.o.FlushBytes {
				return b.buf, nil
			}
			continue
		}
		if b.o.Limit > 0 && b.n >= b.o.Limit {
			return b.end()
		}
		if !b.it.Next() {
			if err := b.it.Err(); err != nil {
				if b.o.Ctx.Err() != nil {
					return nil, b.abort(AbortShutdown, ErrShutdown)
				}
				return nil, b.abort(AbortSourceError, err)
			}
			return b.end()
		}
		rec := b.it.Record()
		switch b.format {
		case FormatChunks:
			if !rec.LiveAt(b.o.Now) {
				continue
			}
			b.n++
			b.buf = AppendKeyNewlineValue(b.buf, b.it.Key(), rec.Value)
			return b.buf, nil
		case FormatBinary:
			if !rec.LiveAt(b.o.Now) {
				continue
			}
			b.buf = AppendRecord(b.buf, b.it.Key(), rec.Value)
		case FormatJSON:
			if !rec.LiveAt(b.o.Now) {
				continue
			}
			if len(rec.Value) <= b.o.FlushBytes {
				b.buf = framing.AppendJSON(b.buf, b.it.Key(), rec.Value)
				break
			}
			b.buf, b.jsonMore = framing.AppendJSONStart(b.buf, b.it.Key(), rec.Value)
		default:
			b.buf = AppendRecord(b.buf, b.it.Key(), b.it.Envelope())
		}
		b.n++
		if len(b.buf) >= b.o.FlushBytes {
			return b.buf, nil
		}
	}
}

// end completes the stream: the last piece, with the binary framings' end
// marker, and io.EOF.
func (b *Body) end() ([]byte, error) {
	b.done = true
	if b.format == FormatBinary || b.format == FormatInternal {
		b.buf = AppendEnd(b.buf, b.n)
	}
	return b.buf, io.EOF
}

func (b *Body) count() {
	if b.o.Metrics != nil && b.n > b.counted {
		b.o.Metrics.Records.Add(float64(b.n - b.counted))
	}
	b.counted = b.n
}

// abort records why the stream stops and returns err wrapped with context.
func (b *Body) abort(reason string, err error) error {
	if b.reason == "" {
		b.reason = reason
		if b.o.Metrics != nil {
			b.o.Metrics.Aborts.WithLabelValues(reason).Inc()
		}
		level := slog.LevelDebug // clients going away is normal
		if reason == AbortSourceError {
			level = slog.LevelWarn
		}
		b.o.Log.Log(context.Background(), level, "range stream aborted",
			"stream", b.o.Name, "reason", reason, "records", b.n, "err", err)
	}
	return fmt.Errorf("scan %s after %d records: %w", b.o.Name, b.n, err)
}

// Close releases the iterator. fasthttp calls it after the body was
// written, or failed, or was never written (the connection died first):
// the last case also counts as the client gone.
func (b *Body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if !b.finished && b.reason == "" {
		b.abort(AbortClientGone, errors.New("body closed before the end"))
	}
	b.stall.close()
	err := b.it.Close()
	if b.o.OnClose != nil {
		b.o.OnClose()
	}
	if err != nil {
		return fmt.Errorf("scan %s: %w", b.o.Name, err)
	}
	return nil
}
