package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
)

// TestShapeAndSlices: a store's writes sit in L0 (Above is all of it);
// compacted, every table is in the bottom level, and Slices cuts the key
// space at that level's tables into contiguous ranges that cover it.
func TestShapeAndSlices(t *testing.T) {
	o := DefaultOptions()
	o.FS, o.Sync, o.MemTableBytes, o.Ballast.Percent, o.L0CompactionThreshold = vfs.NewMem(), false, 1<<20, 0, 64
	s, err := Open("db", o)
	require.NoError(t, err)
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	value := make([]byte, 1024)
	for i := range 12000 {
		for j := range value {
			value[j] = byte(rng.Uint32())
		}
		require.NoError(t, s.Apply(fmt.Appendf(nil, "k%06d", rng.IntN(12000)), &record.Record{Version: uint64(i + 1), Value: value}))
	}
	one, err := s.Slices(1 << 20)
	require.NoError(t, err)
	require.Len(t, one, 1, "L0's tables overlap: one range")
	sh := s.Shape()
	assert.Equal(t, sh.Total, sh.Above)
	assert.Positive(t, sh.WALBytes)

	require.NoError(t, s.CompactRange(t.Context(), one[0]))
	wal := sh.WALBytes
	sh = s.Shape()
	assert.Zero(t, sh.Above)
	assert.Equal(t, wal, sh.WALBytes, "a compaction writes nothing to the WAL")
	slices, err := s.Slices(1 << 20)
	require.NoError(t, err)
	require.Greater(t, len(slices), 1, "%+v", sh)
	var sum uint64
	for i, r := range slices {
		require.Negative(t, bytes.Compare(r.Start, r.End), "slice %d", i)
		if i > 0 {
			require.Equal(t, slices[i-1].End, r.Start, "slice %d starts where the last ended", i)
		}
		sum += r.Bytes
	}
	assert.Empty(t, slices[0].Start)
	assert.Equal(t, []byte{0xff, 0xff}, slices[len(slices)-1].End)
	assert.Equal(t, sh.Total, sum)
}
