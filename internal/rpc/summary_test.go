package rpc

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

func summaryServer(t *testing.T, keys int) (*Server, map[string]uint64) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	want := map[string]uint64{}
	for i := range keys {
		k := fmt.Sprintf("k%d", i)
		want[k] = uint64(100 + i)
		require.NoError(t, st.Apply([]byte(k), &record.Record{Version: want[k], Value: []byte(k)}))
	}
	return &Server{Replica: &replica.Replica{Store: st}, Log: slog.Default()}, want
}

// TestServeSummary: the two steps against a real store. Partitions whose
// hash matches are left out of the answer; the segments that differ list
// exactly the store's keys and versions; the asker's parsers read back
// what the server wrote.
func TestServeSummary(t *testing.T) {
	s, want := summaryServer(t, 2000)
	st := s.Replica.Store
	parts := make([]partition.ID, partition.Count)
	hashes := make([]uint64, partition.Count)
	for p := range parts {
		parts[p] = partition.ID(p)
		h, _, err := st.PartitionHash(parts[p])
		require.NoError(t, err)
		hashes[p] = h
	}
	ans, err := s.ServeSummary(AppendPartitionsRequest(nil, parts, hashes), nil)
	require.NoError(t, err)
	require.Empty(t, ans, "every partition agrees")

	// An asker that holds nothing: every non-empty partition differs.
	ans, err = s.ServeSummary(AppendPartitionsRequest(nil, parts, make([]uint64, len(parts))), nil)
	require.NoError(t, err)
	diff, err := ParsePartitionsAnswer(ans, parts)
	require.NoError(t, err)
	var segs []Segment
	for _, d := range diff {
		for i, h := range d.Hashes {
			if h != 0 {
				segs = append(segs, Segment{Part: d.Part, Seg: uint8(i)})
			}
		}
	}
	got := map[string]uint64{}
	for len(segs) > 0 {
		ans, err := s.ServeSummary(AppendSegmentsRequest(nil, segs), nil)
		require.NoError(t, err)
		lists, err := ParseSegmentsAnswer(ans, segs, 100)
		require.NoError(t, err)
		for _, l := range lists {
			for _, e := range l.Entries {
				p, sg := partition.Of(e.Key)
				require.Equal(t, l.Segment, Segment{Part: p, Seg: sg}, "key %q", e.Key)
				got[string(e.Key)] = e.Version
			}
		}
		segs = segs[len(lists):]
	}
	require.Equal(t, want, got)
}

// TestServeSummaryRefuses: malformed requests get 400 with the reason,
// and a rebuilding node 503, never a partial answer.
func TestServeSummaryRefuses(t *testing.T) {
	s, _ := summaryServer(t, 10)
	for _, tc := range []struct {
		name, body string
		want       string
	}{
		{"empty", "", "empty"},
		{"unknown step", "x", "unknown step"},
		{"partitions framing", "p\x00\x01\x02", "bytes of partition hashes"},
		{"partition out of range", "p\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00", "partition 65535"},
		{"segments framing", "s\x00", "bytes of segments"},
		{"segment out of range", "s\x00\x01\x40", "segment 1/64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.ServeSummary([]byte(tc.body), nil)
			e, ok := IsRefusal(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, http.StatusBadRequest, e.Status)
			require.Contains(t, e.Msg, tc.want)
		})
	}
	s.Rebuilding = func() bool { return true }
	_, err := s.ServeSummary([]byte("p"), nil)
	e, ok := IsRefusal(err)
	require.True(t, ok)
	require.Equal(t, http.StatusServiceUnavailable, e.Status)
}

// TestParseSummaryAnswers: an answer that does not match its request is
// refused: a partition or segment not asked for, out of order, or framing
// beyond the bytes.
func TestParseSummaryAnswers(t *testing.T) {
	asked := []Segment{{1, 2}, {3, 4}}
	for _, tc := range []struct {
		name string
		ans  string
		ok   int // lists read; -1: an error
	}{
		{"one of two", "\x00\x01\x02\x01\x01a" + "\x00\x00\x00\x00\x00\x00\x00\x07", 1},
		{"both, empty", "\x00\x01\x02\x00\x00\x03\x04\x00", 2},
		{"out of order", "\x00\x03\x04\x00", -1},
		{"not asked", "\x00\x01\x02\x00\x00\x03\x04\x00\x00\x05\x06\x00", -1},
		{"empty answer", "", -1},
		{"count beyond the bytes", "\x00\x01\x02\x05", -1},
		{"key beyond the bytes", "\x00\x01\x02\x01\x09a", -1},
		{"empty key", "\x00\x01\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00\x07", -1},
		{"key too long", "\x00\x01\x02\x01\x02ab\x00\x00\x00\x00\x00\x00\x00\x07", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lists, err := ParseSegmentsAnswer([]byte(tc.ans), asked, 1)
			if tc.ok < 0 {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Len(t, lists, tc.ok)
		})
	}
	_, err := ParsePartitionsAnswer(make([]byte, 2+8*partition.Segments), []partition.ID{1})
	require.ErrorContains(t, err, "partition 0 was not asked for")
	_, err = ParsePartitionsAnswer(make([]byte, 7), []partition.ID{0})
	require.Error(t, err)
}

// FuzzParseSegmentsAnswer: no answer makes the parser panic or return
// keys outside the answer.
func FuzzParseSegmentsAnswer(f *testing.F) {
	f.Add([]byte("\x00\x01\x02\x01\x01a\x00\x00\x00\x00\x00\x00\x00\x07"))
	f.Add([]byte("\x00\x01\x02\x00\x00\x03\x04\x00"))
	f.Fuzz(func(t *testing.T, ans []byte) {
		lists, err := ParseSegmentsAnswer(ans, []Segment{{1, 2}, {3, 4}}, 64)
		if err != nil {
			return
		}
		for _, l := range lists {
			for _, e := range l.Entries {
				if len(e.Key) == 0 || len(e.Key) > 64 {
					t.Fatalf("key of %d bytes", len(e.Key))
				}
			}
		}
	})
}

// A segments answer's count is bounded by the entries its bytes can
// hold (each takes at least 10: a length, a key byte, a version) before
// the parser allocates for it: a misbehaving peer's answer of 1 MiB
// claiming 1M entries (the bound was the answer's length) made the
// asker allocate 32 MiB of entries, 32 times the answer, and up to
// 256 MiB per exchange step within the summary client's 8 MiB answers.
func TestParseSegmentsAnswerCountBoundedByItsBytes(t *testing.T) {
	const size = 1 << 20
	ans := make([]byte, 0, size)
	ans = append(ans, 0, 1, 2) // partition 1, segment 2
	ans = binary.AppendUvarint(ans, uint64(size-8))
	ans = ans[:size] // zeros: no entry is valid
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ParseSegmentsAnswer(ans, []Segment{{1, 2}}, 64)
	runtime.ReadMemStats(&after)
	require.Error(t, err)
	allocs := after.TotalAlloc - before.TotalAlloc
	require.Less(t, allocs, uint64(2*size), "bytes allocated to parse an answer of %d bytes", size)
}
