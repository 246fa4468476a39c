package record

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{Version: 1, Value: []byte("v")},
		{Version: 1<<63 + 5, Value: []byte{}},
		{Version: 42, Tombstone: true},
		{Version: 7, Value: []byte("a\nb\x00\xff")},
		{Version: 8, ExpiresAt: 1_800_000_000_000, Value: []byte("expires")},
		{Version: 9, ExpiresAt: 1, Value: []byte{}},
		{Version: 10, ExpiresAt: MaxExpiresAt, Value: []byte("the last expiry an int64 holds")},
	} {
		got, err := Decode(r.Encode())
		require.NoError(t, err)
		require.Len(t, r.Encode(), r.EncodedSize())
		require.Equal(t, r.Version, got.Version)
		require.Equal(t, r.Tombstone, got.Tombstone)
		require.Equal(t, r.ExpiresAt, got.ExpiresAt)
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
		"expiry cut short":   append([]byte{1, 2}, good[2:]...),
		"expiry zero":        append(append([]byte{1, 2}, good[2:HeaderSize]...), 0, 0, 0, 0, 0, 0, 0, 0),
		"expiring tombstone": append(append([]byte{1, 3}, good[2:HeaderSize]...), 0, 0, 0, 0, 0, 0, 0, 9),
		"expiry 2^64-1":      append(append([]byte{1, 2}, good[2:HeaderSize]...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"expiry 2^63":        append(append([]byte{1, 2}, good[2:HeaderSize]...), 0x80, 0, 0, 0, 0, 0, 0, 0),
		"expiry 2^63, value": append(append(append([]byte{1, 2}, good[2:HeaderSize]...), 0x80, 0, 0, 0, 0, 0, 0, 0), 'x'),
	} {
		_, err := Decode(b)
		require.ErrorIs(t, err, ErrCorrupt, name)
	}
}

// TestLiveAt: a value is live until its expiry (exclusive); a tombstone
// never is.
func TestLiveAt(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for _, tc := range []struct {
		name string
		rec  Record
		t    time.Time
		want bool
	}{
		{"value", Record{Version: 1}, at(5), true},
		{"tombstone", Record{Version: 1, Tombstone: true}, at(5), false},
		{"before expiry", Record{Version: 1, ExpiresAt: 10}, at(9), true},
		{"at expiry", Record{Version: 1, ExpiresAt: 10}, at(10), false},
		{"after expiry", Record{Version: 1, ExpiresAt: 10}, at(11), false},
	} {
		require.Equal(t, tc.want, tc.rec.LiveAt(tc.t), tc.name)
	}
}
