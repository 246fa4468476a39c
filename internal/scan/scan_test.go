package scan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// sliceIter is an Iterator over records in memory; failAfter >= 0 makes it
// fail after that many records.
type sliceIter struct {
	keys      []string
	recs      []record.Record
	i         int
	env       []byte
	failAfter int
	err       error
	closed    bool
}

func newSliceIter(m map[string]record.Record) *sliceIter {
	s := &sliceIter{i: -1, failAfter: -1}
	for k := range m {
		s.keys = append(s.keys, k)
	}
	sort.Strings(s.keys)
	for _, k := range s.keys {
		s.recs = append(s.recs, m[k])
	}
	return s
}

func (s *sliceIter) Next() bool {
	if s.err != nil {
		return false
	}
	if s.failAfter >= 0 && s.i+1 >= s.failAfter {
		s.err = errors.New("injected failure")
		return false
	}
	s.i++
	if s.i >= len(s.keys) {
		return false
	}
	s.env = s.recs[s.i].Encode()
	return true
}
func (s *sliceIter) Key() []byte           { return []byte(s.keys[s.i]) }
func (s *sliceIter) Envelope() []byte      { return s.env }
func (s *sliceIter) Record() record.Record { r, _ := record.Decode(s.env); return r }
func (s *sliceIter) Err() error            { return s.err }
func (s *sliceIter) Close() error          { s.closed = true; return nil }

func live(v string, version uint64) record.Record {
	return record.Record{Version: version, Value: []byte(v)}
}

func dead(version uint64) record.Record { return record.Record{Version: version, Tombstone: true} }

func TestMergeNewestWinsAndKeepsTombstones(t *testing.T) {
	a := newSliceIter(map[string]record.Record{"a": live("a1", 1), "b": live("b3", 3), "d": dead(5), "e": live("e1", 1)})
	b := newSliceIter(map[string]record.Record{"a": live("a2", 2), "b": live("b1", 1), "c": live("c1", 1), "d": live("d4", 4)})
	c := newSliceIter(map[string]record.Record{"a": live("a2", 2), "f": live("f1", 1)})
	m := NewMerge([]Iterator{a, b, c})
	var got []string
	for m.Next() {
		r := m.Record()
		got = append(got, fmt.Sprintf("%s=%s/%d/%v", m.Key(), r.Value, r.Version, r.Tombstone))
		env, err := record.Decode(m.Envelope())
		require.NoError(t, err)
		require.Equal(t, r.Version, env.Version)
	}
	require.NoError(t, m.Err())
	require.Equal(t, []string{"a=a2/2/false", "b=b3/3/false", "c=c1/1/false", "d=/5/true", "e=e1/1/false", "f=f1/1/false"}, got)
	require.NoError(t, m.Close())
	require.True(t, a.closed && b.closed && c.closed)
}

func TestMergeRandomAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	want := map[string]record.Record{}
	var parts []map[string]record.Record
	for range 4 {
		parts = append(parts, map[string]record.Record{})
	}
	for v := uint64(1); v <= 3000; v++ {
		k := fmt.Sprintf("k%04d", rng.IntN(800))
		r := live(fmt.Sprint(v), v)
		if rng.IntN(5) == 0 {
			r = dead(v)
		}
		want[k] = r
		for _, p := range parts {
			if rng.IntN(2) == 0 {
				p[k] = r
			}
		}
	}
	// The newest version of a key must be on at least one source for the
	// merge to find it; drop keys whose newest was lost.
	var srcs []Iterator
	for _, p := range parts {
		srcs = append(srcs, newSliceIter(p))
	}
	m := NewMerge(srcs)
	seen := 0
	prev := ""
	for m.Next() {
		k := string(m.Key())
		require.Greater(t, k, prev)
		prev = k
		newest := uint64(0)
		for _, p := range parts {
			if r, ok := p[k]; ok && r.Version > newest {
				newest = r.Version
			}
		}
		require.Equal(t, newest, m.Record().Version, k)
		seen++
	}
	require.NoError(t, m.Err())
	union := map[string]bool{}
	for _, p := range parts {
		for k := range p {
			union[k] = true
		}
	}
	require.Equal(t, len(union), seen)
}

func TestMergeStopsOnSourceError(t *testing.T) {
	a := newSliceIter(map[string]record.Record{"a": live("1", 1), "b": live("1", 1), "c": live("1", 1)})
	b := newSliceIter(map[string]record.Record{"a": live("1", 1), "b": live("1", 1), "c": live("1", 1)})
	b.failAfter = 1
	m := NewMerge([]Iterator{a, b})
	n := 0
	for m.Next() {
		n++
	}
	require.Equal(t, 1, n)
	require.ErrorContains(t, m.Err(), "injected failure")
}

// chunkWriter records every Write as one chunk, like fasthttp's chunked
// body writer.
type chunkWriter struct {
	chunks  [][]byte
	failAt  int
	written int
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	if w.failAt > 0 && len(w.chunks) >= w.failAt {
		return 0, errors.New("broken pipe")
	}
	w.chunks = append(w.chunks, bytes.Clone(p))
	w.written += len(p)
	return len(p), nil
}

func TestBodyFormats(t *testing.T) {
	data := map[string]record.Record{"a": live("x\ny", 1), "b": dead(2), "c": live("", 3), "d": live("zz", 4)}

	t.Run("chunks: one chunk per live record", func(t *testing.T) {
		var w chunkWriter
		b := NewBody(newSliceIter(data), FormatChunks, BodyOptions{})
		_, err := b.WriteTo(&w)
		require.NoError(t, err)
		require.NoError(t, b.Close())
		require.Equal(t, [][]byte{[]byte("a\nx\ny"), []byte("c\n"), []byte("d\nzz")}, w.chunks)
	})
	t.Run("binary: batched, live only, end marker", func(t *testing.T) {
		var w chunkWriter
		b := NewBody(newSliceIter(data), FormatBinary, BodyOptions{FlushBytes: 8})
		_, err := b.WriteTo(&w)
		require.NoError(t, err)
		require.Greater(t, len(w.chunks), 1)
		d := NewDecoder(bytes.NewReader(bytes.Join(w.chunks, nil)), 16, 64)
		var got []string
		for d.Next() {
			got = append(got, string(d.Key())+"="+string(d.Value()))
		}
		require.NoError(t, d.Err())
		require.Equal(t, []string{"a=x\ny", "c=", "d=zz"}, got)
	})
	t.Run("internal: tombstones and envelopes", func(t *testing.T) {
		var w chunkWriter
		b := NewBody(newSliceIter(data), FormatInternal, BodyOptions{})
		_, err := b.WriteTo(&w)
		require.NoError(t, err)
		it := NewDecoderIterator(NewDecoder(bytes.NewReader(bytes.Join(w.chunks, nil)), 16, 64), nil, "test")
		var got []string
		for it.Next() {
			r := it.Record()
			got = append(got, fmt.Sprintf("%s/%d/%v", it.Key(), r.Version, r.Tombstone))
		}
		require.NoError(t, it.Err())
		require.Equal(t, []string{"a/1/false", "b/2/true", "c/3/false", "d/4/false"}, got)
	})
	t.Run("json: batched, live only, one object per line", func(t *testing.T) {
		var w chunkWriter
		bin := map[string]record.Record{"a": live("x\ny", 1), "b": dead(2), "c\xff": live("\x00", 3)}
		b := NewBody(newSliceIter(bin), FormatJSON, BodyOptions{FlushBytes: 8})
		_, err := b.WriteTo(&w)
		require.NoError(t, err)
		require.Len(t, w.chunks, 2, "a batch per FlushBytes, no end marker")
		require.Equal(t, `{"key":"a","value":"x\ny"}`+"\n"+`{"key_base64":"Y/8=","value":"\u0000"}`+"\n", string(bytes.Join(w.chunks, nil)))
	})
	t.Run("read fallback", func(t *testing.T) {
		b := NewBody(newSliceIter(data), FormatBinary, BodyOptions{FlushBytes: 4})
		all, err := io.ReadAll(b)
		require.NoError(t, err)
		d := NewDecoder(bytes.NewReader(all), 16, 64)
		for d.Next() {
		}
		require.NoError(t, d.Err())
		require.Equal(t, uint64(3), d.Count())
	})
}

// TestBodyLimit: a limit counts the records a framing shows (live ones in
// the public framings, every one in the internal), ends the stream as
// complete (the end marker counts the records sent), and does not advance
// the iterator past the last record sent.
func TestBodyLimit(t *testing.T) {
	data := map[string]record.Record{"a": dead(1), "b": live("b", 2), "c": dead(3), "d": live("d", 4), "e": live("e", 5), "f": dead(6)}
	keys := func(f Format, chunks [][]byte) []string {
		all := bytes.Join(chunks, nil)
		var ks []string
		switch f {
		case FormatChunks:
			for _, c := range chunks {
				k, _, _ := bytes.Cut(c, []byte("\n"))
				ks = append(ks, string(k))
			}
		case FormatJSON:
			for _, l := range bytes.SplitAfter(all, []byte("\n")) {
				if k, ok := bytes.CutPrefix(l, []byte(`{"key":"`)); ok {
					ks = append(ks, string(k[:1]))
				}
			}
		default:
			d := NewDecoder(bytes.NewReader(all), 16, 64)
			for d.Next() {
				ks = append(ks, string(d.Key()))
			}
			require.NoError(t, d.Err(), "a limited stream is complete")
		}
		return ks
	}
	for _, tc := range []struct {
		name  string
		f     Format
		limit uint64
		want  []string
		read  int // records the iterator was advanced to
	}{
		{"chunks, no limit", FormatChunks, 0, []string{"b", "d", "e"}, 6},
		{"chunks, 1 live", FormatChunks, 1, []string{"b"}, 2},
		{"chunks, 2 live", FormatChunks, 2, []string{"b", "d"}, 4},
		{"binary, 2 live", FormatBinary, 2, []string{"b", "d"}, 4},
		{"binary, limit above the range", FormatBinary, 10, []string{"b", "d", "e"}, 6},
		{"binary, limit equal to the range", FormatBinary, 3, []string{"b", "d", "e"}, 5},
		{"json, 2 live", FormatJSON, 2, []string{"b", "d"}, 4},
		{"internal counts tombstones", FormatInternal, 2, []string{"a", "b"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newSliceIter(data)
			var w chunkWriter
			b := NewBody(src, tc.f, BodyOptions{Limit: tc.limit, FlushBytes: 1})
			_, err := b.WriteTo(&w)
			require.NoError(t, err)
			require.NoError(t, b.Close())
			require.True(t, src.closed)
			require.Equal(t, tc.want, keys(tc.f, w.chunks))
			require.Equal(t, tc.read, min(src.i+1, len(src.keys)), "records the iterator read")
		})
	}
}

func TestBodyErrors(t *testing.T) {
	data := map[string]record.Record{}
	for i := range 100 {
		data[fmt.Sprintf("k%03d", i)] = live("v", uint64(i+1))
	}
	t.Run("source failure: error, no end marker", func(t *testing.T) {
		src := newSliceIter(data)
		src.failAfter = 50
		var w chunkWriter
		b := NewBody(src, FormatBinary, BodyOptions{FlushBytes: 32})
		_, err := b.WriteTo(&w)
		require.ErrorContains(t, err, "injected failure")
		require.NoError(t, b.Close())
		require.True(t, src.closed)
		d := NewDecoder(bytes.NewReader(bytes.Join(w.chunks, nil)), 16, 64)
		for d.Next() {
		}
		require.ErrorIs(t, d.Err(), ErrTruncated)
	})
	t.Run("client gone: stops producing", func(t *testing.T) {
		src := newSliceIter(data)
		w := chunkWriter{failAt: 3}
		b := NewBody(src, FormatChunks, BodyOptions{})
		_, err := b.WriteTo(&w)
		require.ErrorContains(t, err, "broken pipe")
		require.Len(t, w.chunks, 3, "3 written, the 4th failed")
		require.NoError(t, b.Close())
		require.True(t, src.closed)
	})
}

// A JSON record is written in pieces of about FlushBytes, not built whole:
// a value of control characters, valid UTF-8, is escaped as \u00XX, six
// bytes a byte, and a stream of a 16 MiB value held a 96 MiB piece (64
// such streams, --max-scans, 6 GiB) where the other framings hold the
// value's size (docs/range-scans.md: "a larger record is one piece of its
// own size, bounded by --max-value-bytes").
func TestBodyJSONPieceBoundedByTheValue(t *testing.T) {
	value := bytes.Repeat([]byte{0x01, '"', 'a', 0xe2, 0x80, 0xa8}, 1<<17) // 768 KiB, escapes and U+2028 across piece boundaries
	var w chunkWriter
	b := NewBody(newSliceIter(map[string]record.Record{"k": live(string(value), 1), "l": live("x", 2)}), FormatJSON, BodyOptions{})
	_, err := b.WriteTo(&w)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	most := 0
	for _, c := range w.chunks {
		most = max(most, len(c))
	}
	require.LessOrEqual(t, most, len(value), "largest piece written for a value of %d bytes", len(value))
	lines := bytes.Split(bytes.TrimSuffix(bytes.Join(w.chunks, nil), []byte("\n")), []byte("\n"))
	require.Len(t, lines, 2)
	var got struct{ Key, Value string }
	require.NoError(t, json.Unmarshal(lines[0], &got))
	require.Equal(t, "k", got.Key)
	require.Equal(t, string(value), got.Value, "the value round-trips")
	want := framing.AppendJSON(nil, []byte("k"), value)
	require.Equal(t, string(want), string(lines[0])+"\n", "byte for byte AppendJSON's")
	require.Equal(t, `{"key":"l","value":"x"}`, string(lines[1]))
}
