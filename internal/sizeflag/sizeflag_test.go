package sizeflag

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "64MiB", want: 64 << 20},
		{in: "64mib", want: 64 << 20},
		{in: "64 MiB", want: 64 << 20},
		{in: "64Mi", want: 64 << 20},
		{in: "1.5GiB", want: 3 << 29},
		{in: "8KiB", want: 8 << 10},
		{in: "1GB", want: 1_000_000_000},
		{in: "1G", want: 1_000_000_000},
		{in: "1kB", want: 1000},
		{in: "1k", want: 1000},
		{in: "2TiB", want: 2 << 40},
		{in: "7EiB", want: 7 << 60},
		{in: "", err: "is not a size"},
		{in: "lots", err: "is not a size"},
		{in: "-1", err: "is not a size"},
		{in: "64XB", err: "is not a size"},
		{in: "8EiB", err: "too large"}, // 2^63: beyond int64
		{in: "16EiB", err: "is not a size"},
	} {
		got, err := Parse[int64](tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%q", tc.in)
			continue
		}
		if assert.NoError(t, err, "%q", tc.in) {
			assert.Equal(t, tc.want, got, "%q", tc.in)
		}
	}
	// The range is the field's: an int flag refuses what its type cannot
	// hold; a uint64 flag takes all 64 bits.
	_, err := Parse[int](strconv.FormatUint(math.MaxInt+1, 10))
	assert.ErrorContains(t, err, "too large")
	u, err := Parse[uint64]("8EiB")
	require.NoError(t, err)
	assert.Equal(t, uint64(1)<<63, u)
}

// A value that is not a size gets an error that says what is wrong with
// it and what a size looks like, not go-humanize's strconv error about
// the number it found before the unit (`"lots": strconv.ParseFloat:
// parsing ""`).
func TestParseSizeErrors(t *testing.T) {
	for _, tc := range []struct {
		in, why string
	}{
		{"", "it is empty"},
		{" ", "it is empty"},
		{"lots", "it does not start with a number"},
		{"-1", "it does not start with a number"},
		{"MiB", "it does not start with a number"},
		{"64XB", `unknown unit "xb"`},
		{"1.2.3MiB", `"1.2.3" is not a number`},
		{"16EiB", "it is too large"},
	} {
		_, err := Parse[int64](tc.in)
		require.Error(t, err, "%q", tc.in)
		msg := err.Error()
		assert.Contains(t, msg, strconv.Quote(tc.in)+" is not a size: "+tc.why, "%q", tc.in)
		assert.Contains(t, msg, "64MiB", "%q: what a size looks like", tc.in)
		assert.NotContains(t, msg, "strconv", "%q", tc.in)
		assert.NotContains(t, msg, "unhandled size name", "%q", tc.in)
	}
}

// What -h prints as a default reads back as the same size.
func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0"},
		{1, "1"},
		{1000, "1000"},
		{1024, "1KiB"},
		{1536, "1536"},
		{64 << 20, "64MiB"},
		{3 << 30, "3GiB"},
		{(64 << 20) + 1, "67108865"},
		{5 << 40, "5TiB"},
	} {
		assert.Equal(t, tc.want, Format(tc.in))
		back, err := Parse[uint64](tc.want)
		require.NoError(t, err)
		assert.Equal(t, tc.in, back, "%s parses back", tc.want)
	}
}
