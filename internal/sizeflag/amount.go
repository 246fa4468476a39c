package sizeflag

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Amount is a size in bytes or a percentage of something whose size is
// known later, such as the volume a data directory is on (--min-free-space
// 5%, or 2GiB). The zero Amount is 0 bytes.
type Amount struct {
	// Bytes is the size when Percent is 0.
	Bytes uint64
	// Percent, when above 0, is a percentage (at most 100) of the whole
	// that Of is given.
	Percent float64
}

// Of is the amount in bytes of a whole of total bytes: Bytes, or Percent
// of total, rounded down.
func (a Amount) Of(total uint64) uint64 {
	if a.Percent > 0 {
		return uint64(float64(total) * a.Percent / 100)
	}
	return a.Bytes
}

// IsZero reports whether the amount is 0 whatever the whole.
func (a Amount) IsZero() bool { return a.Percent == 0 && a.Bytes == 0 }

// String prints a percentage as "5%" and a size as Format does, so that
// what -h prints as a default parses back to the same amount.
func (a Amount) String() string {
	if a.Percent > 0 {
		return strconv.FormatFloat(a.Percent, 'f', -1, 64) + "%"
	}
	return Format(a.Bytes)
}

// ParseAmount reads s as a percentage, a number from 0 to 100 followed
// by "%" ("5%", "0.5%"), or else as a size (Parse: "2GiB", "1048576").
func ParseAmount(s string) (Amount, error) {
	if num, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 100 {
			return Amount{}, fmt.Errorf("%q is not a percentage: a percentage is a number from 0 to 100 followed by %%, such as 5%%", s)
		}
		return Amount{Percent: p}, nil
	}
	n, err := Parse[uint64](s)
	if err != nil {
		return Amount{}, fmt.Errorf("%w; or a percentage, such as 5%%", err)
	}
	return Amount{Bytes: n}, nil
}

// amountValue is a flag.Value for an Amount stored in *p.
type amountValue struct{ p *Amount }

// AmountVar defines the flag name, stored in *p, whose default is *p's
// value: a size (Var's forms) or a percentage ("5%").
func AmountVar(fs *flag.FlagSet, p *Amount, name, usage string) {
	fs.Var(amountValue{p}, name, usage)
}

func (v amountValue) Set(s string) error {
	a, err := ParseAmount(s)
	if err != nil {
		return err
	}
	*v.p = a
	return nil
}

func (v amountValue) String() string {
	if v.p == nil { // the zero Value flag.PrintDefaults makes
		return "0"
	}
	return v.p.String()
}
