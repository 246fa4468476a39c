package scan

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/scan/framing"
	"github.com/dhtkv/dhtkv/internal/store"
)

// releasingIter is a sliceIter that counts its releases and fails the
// test if a release overlaps any other call, which the Body must never
// let happen.
type releasingIter struct {
	*sliceIter
	t        *testing.T
	busy     atomic.Bool
	releases atomic.Int32
	fail     error // returned by Release
}

func (r *releasingIter) enter() func() {
	if !r.busy.CompareAndSwap(false, true) {
		r.t.Error("the iterator was used by two goroutines at once")
	}
	return func() { r.busy.Store(false) }
}

func (r *releasingIter) Next() bool {
	defer r.enter()()
	return r.sliceIter.Next()
}

func (r *releasingIter) Release() error {
	defer r.enter()()
	r.releases.Add(1)
	return r.fail
}

func releasing(t *testing.T, n int) *releasingIter {
	m := map[string]record.Record{}
	for i := range n {
		m[fmt.Sprintf("k%04d", i)] = live(fmt.Sprintf("v%d", i), 1)
	}
	return &releasingIter{sliceIter: newSliceIter(m), t: t}
}

// TestBodyReleasesWhileWriteBlocks: a write the reader does not take
// within ReleaseAfter releases the iterator (once per stall); writes the
// reader takes at once release nothing; no goroutine outlives the Body.
func TestBodyReleasesWhileWriteBlocks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const after = 20 * time.Millisecond
	it := releasing(t, 5)
	m := NewMetrics(nil)
	client, server := net.Pipe() // every Write blocks until it is read
	defer client.Close()
	b := NewBody(it, FormatChunks, BodyOptions{ReleaseAfter: after, Metrics: m})
	done := make(chan error, 1)
	go func() {
		_, err := b.WriteTo(server)
		server.Close()
		done <- err
	}()

	buf := make([]byte, 64)
	n, err := client.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "k0000\nv0", string(buf[:n]))
	// The stream now blocks writing k0001: the iterator is released.
	require.Eventually(t, func() bool { return it.releases.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1.0, testutil.ToFloat64(m.Releases))
	// Still one release however long the stall lasts.
	time.Sleep(5 * after) // a stall is the behaviour under test
	require.EqualValues(t, 1, it.releases.Load())

	rest, err := io.ReadAll(client)
	require.NoError(t, err)
	require.Equal(t, "k0001\nv1k0002\nv2k0003\nv3k0004\nv4", string(rest))
	require.NoError(t, <-done)
	require.NoError(t, b.Close())
	require.True(t, it.closed)
	require.LessOrEqual(t, it.releases.Load(), int32(5), "at most one release per write")
}

// TestBodyWithoutStallReleasesNothing: a reader that keeps up, or a Body
// without ReleaseAfter, never releases.
func TestBodyWithoutStallReleasesNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, after := range []time.Duration{0, time.Minute} {
		it := releasing(t, 1000)
		b := NewBody(it, FormatBinary, BodyOptions{ReleaseAfter: after, FlushBytes: 64})
		_, err := b.WriteTo(io.Discard)
		require.NoError(t, err)
		require.NoError(t, b.Close())
		require.Zero(t, it.releases.Load(), "ReleaseAfter %v", after)
	}
}

// TestBodyReleaseFailureAbortsStream: an iterator that cannot be released
// fails the stream as a source error once the write returns.
func TestBodyReleaseFailureAbortsStream(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	it := releasing(t, 3)
	it.fail = errors.New("injected release failure")
	m := NewMetrics(nil)
	client, server := net.Pipe()
	defer client.Close()
	b := NewBody(it, FormatChunks, BodyOptions{ReleaseAfter: time.Millisecond, Metrics: m})
	done := make(chan error, 1)
	go func() {
		_, err := b.WriteTo(server)
		server.Close()
		done <- err
	}()
	require.Eventually(t, func() bool { return it.releases.Load() == 1 }, 5*time.Second, time.Millisecond)
	_, _ = io.ReadAll(client)
	err := <-done
	require.ErrorIs(t, err, it.fail)
	require.NoError(t, b.Close())
	require.Equal(t, 1.0, testutil.ToFloat64(m.Aborts.WithLabelValues(AbortSourceError)))
}

// TestMergeReleasesItsReleasers: a Merge releases the sources that can be
// released and keeps merging after it.
func TestMergeReleasesItsReleasers(t *testing.T) {
	a := releasing(t, 3)
	b := newSliceIter(map[string]record.Record{"k0001": live("newer", 2), "k0009": live("x", 1)})
	m := NewMerge([]Iterator{a, b})
	var r Releaser = m
	require.True(t, m.Next())
	require.NoError(t, r.Release())
	require.EqualValues(t, 1, a.releases.Load())
	var got []string
	for {
		got = append(got, fmt.Sprintf("%s=%s", m.Key(), m.Record().Value))
		if !m.Next() {
			break
		}
	}
	require.NoError(t, m.Err())
	require.Equal(t, []string{"k0000=v0", "k0001=newer", "k0002=v2", "k0009=x"}, got)
	a.fail = errors.New("injected")
	require.ErrorIs(t, m.Release(), a.fail)
}

// TestBodyJSONValueInPiecesSurvivesARelease: a JSON record whose value is
// written in pieces (over FlushBytes) keeps the rest of the value across
// steps; a stalled client releases the store iterator between two of
// them, which gives Pebble back the block that value was read from. The
// pieces after the release must still be the value's bytes, not what the
// block's memory holds once the cache freed or reused it.
func TestBodyJSONValueInPiecesSurvivesARelease(t *testing.T) {
	s, err := store.Open(t.TempDir(), store.Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20})
	require.NoError(t, err)
	defer s.Close()
	value := bytes.Repeat([]byte("a"), 100<<10) // over FlushBytes (64 KiB): written in pieces
	require.NoError(t, s.Apply([]byte("k"), &record.Record{Version: 1, Value: value}))
	other := bytes.Repeat([]byte("z"), 100<<10)
	for i := range 20 {
		require.NoError(t, s.Apply(fmt.Appendf(nil, "z%02d", i), &record.Record{Version: 1, Value: other}))
	}
	// In sstables: the iterator's value is then a cached block's memory.
	require.NoError(t, s.CompactRange(t.Context(), store.KeyRange{Start: []byte{0}, End: []byte{0xff}}))

	it, err := s.NewIter([]byte("k"), []byte("k\x00"))
	require.NoError(t, err)
	client, server := net.Pipe() // every Write blocks until it is read
	defer client.Close()
	b := NewBody(it, FormatJSON, BodyOptions{ReleaseAfter: 5 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := b.WriteTo(server)
		server.Close()
		done <- err
	}()
	// The first piece's write blocks: the iterator is released.
	require.Eventually(t, func() bool { return s.RangeIters() == 0 }, 5*time.Second, time.Millisecond)
	for i := range 20 { // other reads take the cache's memory
		_, found, err := s.AppendEnvelope(nil, fmt.Appendf(nil, "z%02d", i))
		require.NoError(t, err)
		require.True(t, found)
	}
	got, err := io.ReadAll(client)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.NoError(t, b.Close())
	want := framing.AppendJSON(nil, []byte("k"), value)
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("the JSON record differs from AppendJSON's from byte %d of %d: got %q..., want %q...", i, len(want), got[i:min(i+16, len(got))], want[i:min(i+16, len(want))])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
