package node

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The plain-HTTP warning is due once per address per minute, says how many
// went unlogged since, and the addresses remembered stay bounded: beyond
// the bound, the others share one warning a minute.
func TestPlainHTTPWarnerRateAndBound(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	w := newPlainHTTPWarner(nil, func() time.Time { return now })
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8::1")
	for i, s := range []struct {
		after      time.Duration // the clock moves on by this first
		addr       netip.Addr
		due        bool
		suppressed int
	}{
		{0, a, true, 0},
		{time.Second, a, false, 0},
		{time.Second, b, true, 0},
		{57 * time.Second, a, false, 0},
		{time.Second, a, true, 2}, // a minute after a's warning
		{0, a, false, 0},
		{time.Second, b, false, 0},
		{time.Second, b, true, 1}, // a minute after b's
	} {
		now = now.Add(s.after)
		suppressed, due := w.due(s.addr)
		assert.Equal(t, s.due, due, "step %d: %s due", i, s.addr)
		assert.Equal(t, s.suppressed, suppressed, "step %d: %s suppressed", i, s.addr)
	}

	// Fill the map with addresses warned just now: a new one shares the
	// extra slot, once a minute; once they are a minute old, the new one
	// gets its own.
	now = now.Add(time.Hour)
	for i := range plainHTTPMaxAddrs {
		_, due := w.due(netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)}))
		require.True(t, due)
	}
	c, d := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	_, due := w.due(c)
	assert.True(t, due, "the first beyond the bound warns, in the shared slot")
	_, due = w.due(d)
	assert.False(t, due, "the others beyond the bound share its minute")
	assert.LessOrEqual(t, w.limit.Len(), plainHTTPMaxAddrs+1)
	now = now.Add(plainHTTPWarnEvery)
	_, due = w.due(d)
	assert.True(t, due)
	assert.True(t, w.limit.Remembers(d), "old entries made room for it")
	assert.LessOrEqual(t, w.limit.Len(), plainHTTPMaxAddrs+1)
}

func TestLooksLikeHTTP(t *testing.T) {
	for _, tc := range []struct {
		first string
		want  bool
	}{
		{"GET /", true},
		{"HEAD ", true},
		{"POST ", true},
		{"PUT /", true},
		{"DELET", true},
		{"OPTIO", true},
		{"PATCH", true},
		{"\x16\x03\x01\x00\xa5", false}, // a TLS ClientHello's record header
		{"GETX ", false},
		{"get /", false},
		{"SSH-2", false},
	} {
		var hdr [5]byte
		copy(hdr[:], tc.first)
		assert.Equal(t, tc.want, looksLikeHTTP(hdr), "%q", tc.first)
	}
}
