package testcluster

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

// A generated data set: record i has key GenKey(i), value GenValue(_,
// base, i) with base = NewBase(valueSize), and version 1+i. FillStore
// writes one into a node's data directory before the node starts; a test
// reading it back re-derives every record instead of keeping them.

// GenKey is the i-th key of a generated data set; keys sort like i.
func GenKey(i int) []byte { return fmt.Appendf(nil, "key%08d", i) }

// GenValue appends the value of record i to dst[:0]: its index, then base,
// with a length that varies with i so that framing errors cannot line up.
func GenValue(dst, base []byte, i int) []byte {
	n := len(base) - i%251
	dst = binary.BigEndian.AppendUint64(dst[:0], uint64(i))
	return append(dst, base[8:n]...)
}

// NewBase returns the value body shared by all records of a data set whose
// values are about size bytes (at least 258).
func NewBase(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + i>>8) // includes '\n' and 0
	}
	return b
}

// FillStore writes records 0..n-1 of a data set straight into a Pebble
// directory, the fast way to prepare data before a node starts on it.
func FillStore(t testing.TB, dir string, n, valueSize int) {
	t.Helper()
	st, err := store.Open(dir, store.Options{Sync: false})
	require.NoError(t, err)
	base := NewBase(valueSize)
	var v []byte
	for i := range n {
		v = GenValue(v, base, i)
		require.NoError(t, st.Apply(GenKey(i), &record.Record{Version: uint64(1 + i), Value: v}))
	}
	require.NoError(t, st.Close())
}
