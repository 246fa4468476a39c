package record

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{Version: 1, Value: []byte("v")},
		{Version: 1<<63 + 5, Value: []byte{}},
		{Version: 42, Tombstone: true},
		{Version: 7, Value: []byte("a\nb\x00\xff")},
	} {
		got, err := Decode(r.Encode())
		require.NoError(t, err)
		require.Equal(t, r.Version, got.Version)
		require.Equal(t, r.Tombstone, got.Tombstone)
		require.Equal(t, string(r.Value), string(got.Value))
		v, ok := PeekVersion(r.Encode())
		require.True(t, ok)
		require.Equal(t, r.Version, v)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := (&Record{Version: 3, Value: []byte("x")}).Encode()
	for name, b := range map[string][]byte{
		"short":              good[:HeaderSize-1],
		"unknown format":     append([]byte{2}, good[1:]...),
		"unknown flags":      append([]byte{1, 0x80}, good[2:]...),
		"tombstone w/ value": append([]byte{1, 1}, good[2:]...),
	} {
		_, err := Decode(b)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
}
