package scan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// Format is how a response body frames its records.
type Format int

const (
	// FormatChunks is the default framing: one HTTP chunk per live record
	// whose content is key '\n' value.
	FormatChunks Format = iota
	// FormatBinary is the binary framing (framing.go) of the live records.
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
//     between, there is no goroutine and no pipe;
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

	pending []byte // Read's leftovers
	pendErr error

	finished bool   // WriteTo or Read reached the end without error
	reason   string // abort reason, "" while none
	closed   bool
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
	return &Body{it: it, format: f, o: o}
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
			n, werr := w.Write(piece)
			total += int64(n)
			if werr != nil {
				return total, b.writeFailed(werr)
			}
			b.count()
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
// the chunk sizes.
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
			b.buf = framing.AppendJSON(b.buf, b.it.Key(), rec.Value)
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
	err := b.it.Close()
	if b.o.OnClose != nil {
		b.o.OnClose()
	}
	if err != nil {
		return fmt.Errorf("scan %s: %w", b.o.Name, err)
	}
	return nil
}
