package sizeflag

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A plain number of bytes went through go-humanize's float64: above 2^53
// it was rounded, and the largest values each type holds were refused as
// "too large" (MaxInt64 rounds up to 2^63).
func TestParseExactBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"9007199254740993", 1<<53 + 1},
		{strconv.FormatUint(math.MaxUint64, 10), math.MaxUint64},
	} {
		got, err := Parse[uint64](tc.in)
		if assert.NoError(t, err, tc.in) {
			assert.Equal(t, tc.want, got, tc.in)
		}
	}
	got, err := Parse[int64](strconv.FormatInt(math.MaxInt64, 10))
	if assert.NoError(t, err, "MaxInt64") {
		assert.Equal(t, int64(math.MaxInt64), got)
	}
}
