package httpapi

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/record"
)

// setMeta's expiry headers: the time in UTC with milliseconds, and the
// seconds left rounded up, 1 or more. An expiry as far off as an envelope
// may carry (record.MaxExpiresAt) is a time in the far future and a large
// ttl, not a time before 1970 or a ttl that wrapped; one beyond it (which
// record.Decode refuses, so only a record made in code) reads as that
// largest one.
func TestSetMetaExpiry(t *testing.T) {
	now := time.Now()
	soon := uint64(now.Add(90 * time.Second).UnixMilli())
	for _, tc := range []struct {
		name    string
		expires uint64
		at      string // X-Dhtkv-Expires-At; "" for any
		minTTL  int64
		maxTTL  int64
	}{
		{"in 90 s", soon, time.UnixMilli(int64(soon)).UTC().Format("2006-01-02T15:04:05.000Z07:00"), 89, 90},
		{"past", 1, "1970-01-01T00:00:00.001Z", 1, 1},
		{"largest", record.MaxExpiresAt, "292278994-08-17T07:12:55.807Z", math.MaxInt64 / int64(time.Second), math.MaxInt64/int64(time.Second) + 1},
		{"beyond the largest", math.MaxUint64, "292278994-08-17T07:12:55.807Z", math.MaxInt64 / int64(time.Second), math.MaxInt64/int64(time.Second) + 1},
	} {
		var h fasthttp.ResponseHeader
		setMeta(&h, &record.Record{Version: 1, ExpiresAt: tc.expires})
		require.Equal(t, tc.at, string(h.Peek(ExpiresAtHeader)), tc.name)
		ttl, err := strconv.ParseInt(string(h.Peek(TTLHeader)), 10, 64)
		require.NoError(t, err, tc.name)
		require.GreaterOrEqual(t, ttl, tc.minTTL, tc.name)
		require.LessOrEqual(t, ttl, tc.maxTTL, tc.name)
	}
}

// ttlLeft rounds up to whole seconds, at least 1, and does not wrap at
// the largest Duration (what time.Until saturates at).
func TestTTLLeft(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Hour, 1},
		{0, 1},
		{time.Nanosecond, 1},
		{time.Second, 1},
		{time.Second + 1, 2},
		{90 * time.Second, 90},
		{math.MaxInt64, math.MaxInt64/int64(time.Second) + 1},
	} {
		require.Equal(t, tc.want, ttlLeft(tc.d), "%v", tc.d)
	}
}
