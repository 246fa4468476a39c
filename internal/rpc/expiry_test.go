package rpc

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
)

// A batch write whose expiry no write makes is refused whole with 400 and
// the reason, and stores nothing, not even the batch's other write: an
// expiry beyond an int64's Unix milliseconds (record.Decode: corrupt), or
// more than record.MaxTTL after its version's time. One at the bound, or
// any shorter, is stored and reads back with its expiry.
func TestServeBatchExpiryBounds(t *testing.T) {
	s, _, _, _ := lateServer(t) // a batch server on real Pebble, in memory
	v := hlc.VersionAt(time.Now()) | 1
	vms := uint64(hlc.TimeOf(v).UnixMilli())
	maxTTL := uint64(record.MaxTTL / time.Millisecond)
	for i, tc := range []struct {
		name    string
		expires uint64
		want    string // the refusal's reason; "" if stored
	}{
		{"2^64-1", math.MaxUint64, "corrupt record: expiry 18446744073709551615 beyond the largest Unix millisecond time"},
		{"2^63", 1 << 63, "corrupt record: expiry"},
		{"2^63-1", math.MaxInt64, "more than the longest ttl (87600h0m0s) after its version's time"},
		{"MaxTTL and a millisecond", vms + maxTTL + 1, "more than the longest ttl"},
		{"MaxTTL", vms + maxTTL, ""},
		{"five seconds", vms + 5000, ""},
		{"already past", 1, ""}, // no write makes one, but it reads as absent: harmless
	} {
		key := []byte{'k', byte('0' + i)}
		other := []byte{'o', byte('0' + i)}
		body := AppendBatchOp(nil, OpWrite, other, (&record.Record{Version: v, Value: []byte("fine")}).Encode())
		body = AppendBatchOp(body, OpWrite, key, (&record.Record{Version: v, ExpiresAt: tc.expires, Value: []byte("x")}).Encode())
		answer, err := s.ServeBatch(body, nil, false)
		if tc.want != "" {
			e, ok := IsRefusal(err)
			require.True(t, ok, "%s: refused with an *Error, got %v", tc.name, err)
			require.Equal(t, http.StatusBadRequest, e.Status, tc.name)
			require.Contains(t, e.Msg, "operation 1: ", tc.name)
			require.Contains(t, e.Msg, tc.want, tc.name)
			require.NotContains(t, e.Msg, "\n", tc.name)
			for _, k := range [][]byte{key, other} {
				got, err := s.Replica.Get(k)
				require.NoError(t, err)
				require.False(t, got.Found, "%s: %s stored by a refused batch", tc.name, k)
			}
			continue
		}
		require.NoError(t, err, tc.name)
		r, rest, err := nextResult(answer)
		require.NoError(t, err)
		require.Equal(t, byte(ResApplied), r.code, tc.name)
		r, _, err = nextResult(rest)
		require.NoError(t, err)
		require.Equal(t, byte(ResApplied), r.code, tc.name)
		got, err := s.Replica.Get(key)
		require.NoError(t, err)
		require.True(t, got.Found, tc.name)
		require.Equal(t, tc.expires, got.Rec.ExpiresAt, tc.name)
	}
}
