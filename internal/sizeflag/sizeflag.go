// Package sizeflag is a flag.Value for sizes in bytes ("64MiB", "1GB"),
// parsed by go-humanize, so that every size flag of every component reads
// and prints sizes alike.
package sizeflag

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag.Value for a size in bytes, stored in *p. It accepts
// what go-humanize's ParseBytes does: a number of bytes ("1048576"), or a
// number and a unit, case-insensitive, optionally separated by a space:
// binary KiB, MiB, GiB, TiB (powers of 1024; Ki, Mi... alone too) or
// decimal kB, MB, GB, TB (powers of 1000; k, M, G, T alone too).
// Fractions are allowed ("1.5GiB"; a fraction of a byte is dropped);
// negative sizes and sizes beyond T's range are refused. It prints a size
// in the largest binary unit that divides it ("64MiB"), else in bytes, so
// that what -h prints as a default parses back to the same size.
type byteSize[T int | int64 | uint64] struct{ p *T }

// Var defines the size flag name, stored in *p, whose default is *p's
// value.
func Var[T int | int64 | uint64](fs *flag.FlagSet, p *T, name, usage string) {
	fs.Var(byteSize[T]{p}, name, usage)
}

func (b byteSize[T]) Set(s string) error {
	n, err := Parse[T](s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

func (b byteSize[T]) String() string {
	if b.p == nil { // the zero Value flag.PrintDefaults makes
		return "0"
	}
	return Format(uint64(*b.p))
}

// sizeForms is what a size looks like, for error messages.
const sizeForms = "a size is a number of bytes (1048576) or a number and a unit: 64MiB, 1.5GiB, 1GB " +
	"(KiB, MiB, GiB, TiB: powers of 1024; kB, MB, GB, TB: powers of 1000)"

// Parse reads s as a size in bytes (see byteSize). Its errors say what is
// wrong with s and what a size looks like; the flag package, and ff for
// the environment and the config file, name the flag.
func Parse[T int | int64 | uint64](s string) (T, error) {
	// A plain number of bytes is read exactly: go-humanize's float64
	// rounds it above 2^53.
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		n, err = humanize.ParseBytes(s)
	}
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: %s; %s", s, notASize(s, err), sizeForms)
	}
	if t := T(n); t < 0 || uint64(t) != n {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return T(n), nil
}

// notASize says why go-humanize refused s, in the terms of sizeForms:
// its own errors name the parts of s it got to (strconv.ParseFloat:
// parsing "" for "lots": the empty number before the unit).
func notASize(s string, err error) string {
	var num *strconv.NumError
	switch unit, unknownUnit := strings.CutPrefix(err.Error(), "unhandled size name: "); {
	case strings.TrimSpace(s) == "":
		return "it is empty"
	case errors.As(err, &num) && num.Num == "":
		return "it does not start with a number"
	case errors.As(err, &num):
		return fmt.Sprintf("%q is not a number", num.Num)
	case unknownUnit:
		return fmt.Sprintf("unknown unit %q", unit)
	case strings.HasPrefix(err.Error(), "too large"):
		return "it is too large"
	default:
		return err.Error()
	}
}

// Format writes n in the largest binary unit that divides it, else in
// bytes.
func Format(n uint64) string {
	for _, u := range []struct {
		size uint64
		name string
	}{{humanize.TiByte, "TiB"}, {humanize.GiByte, "GiB"}, {humanize.MiByte, "MiB"}, {humanize.KiByte, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10)
}
