package framing

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBinaryFramingRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type kv struct{ k, v []byte }
	var recs []kv
	for i := range 500 {
		k := make([]byte, 1+rng.IntN(40))
		for j := range k {
			k[j] = byte(rng.UintN(256)) // every byte value, '\n' and 0 included
		}
		v := make([]byte, rng.IntN(300)*(i%3))
		for j := range v {
			v[j] = byte(rng.UintN(256))
		}
		recs = append(recs, kv{k, v})
	}
	recs = append(recs, kv{[]byte("line\nkey"), []byte("a\nb\r\n\n\x00")})
	var buf []byte
	for _, r := range recs {
		buf = AppendRecord(buf, r.k, r.v)
	}
	buf = AppendEnd(buf, uint64(len(recs)))

	d := NewDecoder(bytes.NewReader(buf), 1024, 1<<20)
	for i := 0; d.Next(); i++ {
		require.True(t, bytes.Equal(recs[i].k, d.Key()), "record %d key", i)
		require.True(t, bytes.Equal(recs[i].v, d.Value()), "record %d value", i)
	}
	require.NoError(t, d.Err())
	require.Equal(t, uint64(len(recs)), d.Count())

	// Every proper prefix is a truncated stream, never a complete one.
	for cut := 0; cut < len(buf); cut += 1 + cut/50 {
		d := NewDecoder(bytes.NewReader(buf[:cut]), 1024, 1<<20)
		for d.Next() {
		}
		require.ErrorIs(t, d.Err(), ErrTruncated, "cut at %d of %d", cut, len(buf))
	}
}

func TestDecoderRejects(t *testing.T) {
	rec := AppendRecord(nil, []byte("k"), []byte("value"))
	cases := map[string]struct {
		stream []byte
		want   string
	}{
		"count mismatch":  {AppendEnd(append([]byte{}, rec...), 2), "counts 2 records, received 1"},
		"trailing data":   {append(AppendEnd(append([]byte{}, rec...), 1), 'x'), "after the end marker"},
		"value too large": {AppendRecord(nil, []byte("k"), make([]byte, 65)), "value length 65 exceeds limit 64"},
		"key too large":   {AppendRecord(nil, make([]byte, 17), nil), "key length 17 exceeds limit 16"},
		"broken body":     {nil, "unexpected EOF"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var r io.Reader = bytes.NewReader(c.stream)
			if c.stream == nil {
				r = io.MultiReader(bytes.NewReader(rec), errReader{io.ErrUnexpectedEOF})
			}
			d := NewDecoder(r, 16, 64)
			for d.Next() {
			}
			require.ErrorContains(t, d.Err(), c.want)
		})
	}
}

// TestDecoderMemoryFollowsTheBytes: a frame whose length says a gigabyte
// and whose stream ends after a few bytes costs the decoder no more than
// those bytes (and its first step), not the gigabyte; a long value that
// does arrive is read whole, in steps.
func TestDecoderMemoryFollowsTheBytes(t *testing.T) {
	const limit = 1 << 30
	frame := binary.AppendUvarint(append(binary.AppendUvarint(nil, 1), 'k'), limit)
	frame = append(frame, "short"...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := NewDecoder(bytes.NewReader(frame), 16, limit)
	require.False(t, d.Next())
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, d.Err(), ErrTruncated)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "allocated for a gigabyte announced")

	long := bytes.Repeat([]byte("v"), 3*readStep+7)
	d = NewDecoder(bytes.NewReader(AppendEnd(AppendRecord(nil, []byte("k"), long), 1)), 16, limit)
	require.True(t, d.Next())
	require.Equal(t, long, d.Value())
	require.False(t, d.Next())
	require.NoError(t, d.Err())
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// FuzzDecoder: whatever a peer or a proxy sends, the decoder never panics,
// never returns a key or value beyond its limits, and accepts a stream
// only if it is the records it returned followed by their end marker and
// nothing after it (no byte after it, no prefix of it, is accepted): what the encoder writes for them, but for lengths
// written with more bytes than they need (binary.ReadUvarint takes
// "\x80\x00" for 0, as protobuf does), so never shorter.
func FuzzDecoder(f *testing.F) {
	f.Add(AppendEnd(nil, 0))
	f.Add(AppendEnd(AppendRecord(AppendRecord(nil, []byte("a"), []byte("1")), []byte("b"), nil), 2))
	f.Add(AppendEnd(AppendRecord(nil, []byte("a"), []byte("1")), 2))
	f.Add(append(AppendEnd(nil, 0), 'x'))
	f.Add([]byte{0x05, 'a'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		const maxKey, maxValue = 16, 64
		d := NewDecoder(bytes.NewReader(in), maxKey, maxValue)
		var again []byte
		for d.Next() {
			if len(d.Key()) == 0 || len(d.Key()) > maxKey || len(d.Value()) > maxValue {
				t.Fatalf("record %d: key of %d bytes, value of %d", d.Count(), len(d.Key()), len(d.Value()))
			}
			again = AppendRecord(again, d.Key(), d.Value())
		}
		if d.Err() != nil {
			return
		}
		again = AppendEnd(again, d.Count())
		if len(again) > len(in) || len(again) == len(in) && !bytes.Equal(again, in) {
			t.Fatalf("accepted %q, which encodes as %q", in, again)
		}
		// Nothing may follow the end marker, and a stream cut anywhere
		// before its end is truncated.
		complete := func(b []byte) bool {
			d := NewDecoder(bytes.NewReader(b), maxKey, maxValue)
			for d.Next() {
			}
			return d.Err() == nil
		}
		if complete(append(in[:len(in):len(in)], 'x')) {
			t.Fatalf("accepted %q with a byte after it", in)
		}
		for cut := range len(in) {
			if complete(in[:cut]) {
				t.Fatalf("accepted %q cut to %q", in, in[:cut])
			}
		}
	})
}

// BenchmarkDecoder reads a stream of 64 records of each size, a new
// decoder per stream (its buffers grow once, as a cluster scan's do).
func BenchmarkDecoder(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		var stream []byte
		for i := range 64 {
			stream = AppendRecord(stream, fmt.Appendf(nil, "k%03d", i), make([]byte, size))
		}
		stream = AppendEnd(stream, 64)
		b.Run(fmt.Sprintf("value=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				d := NewDecoder(bytes.NewReader(stream), 16, 2<<20)
				for d.Next() {
				}
				if d.Err() != nil {
					b.Fatal(d.Err())
				}
			}
		})
	}
}
