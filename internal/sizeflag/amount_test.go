package sizeflag

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAmount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Amount
		of   uint64 // of a whole of 1000 bytes
		err  string
	}{
		{in: "5%", want: Amount{Percent: 5}, of: 50},
		{in: "0.5%", want: Amount{Percent: 0.5}, of: 5},
		{in: " 12.5 % ", want: Amount{Percent: 12.5}, of: 125},
		{in: "100%", want: Amount{Percent: 100}, of: 1000},
		{in: "0%", want: Amount{}, of: 0},
		{in: "64MiB", want: Amount{Bytes: 64 << 20}, of: 64 << 20},
		{in: "0", want: Amount{}, of: 0},
		{in: "1GB", want: Amount{Bytes: 1_000_000_000}, of: 1_000_000_000},
		{in: "101%", err: `"101%" is not a percentage`},
		{in: "-1%", err: `"-1%" is not a percentage`},
		{in: "%", err: `"%" is not a percentage`},
		{in: "NaN%", err: `"NaN%" is not a percentage`},
		{in: "five%", err: `"five%" is not a percentage`},
		{in: "lots", err: `"lots" is not a size`},
		{in: "", err: "it is empty"},
	} {
		got, err := ParseAmount(tc.in)
		if tc.err != "" {
			require.Error(t, err, "%q", tc.in)
			assert.Contains(t, err.Error(), tc.err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
		assert.Equal(t, tc.of, got.Of(1000), "%q of 1000", tc.in)
	}
	// A size that is not one says both forms.
	_, err := ParseAmount("64XB")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "64MiB")
	assert.Contains(t, err.Error(), "5%")
}

// What -h prints as a default reads back as the same amount, through the
// flag.
func TestAmountFlag(t *testing.T) {
	for _, a := range []Amount{{Percent: 5}, {Percent: 0.25}, {Bytes: 1 << 30}, {Bytes: 1000}, {}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var got Amount
		AmountVar(fs, &got, "min", "")
		require.NoError(t, fs.Parse([]string{"--min", a.String()}), a.String())
		assert.Equal(t, a, got, a.String())
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	got := Amount{Percent: 5}
	AmountVar(fs, &got, "min", "")
	assert.Equal(t, "5%", fs.Lookup("min").DefValue)
	assert.Error(t, fs.Parse([]string{"--min", "200%"}))
}
