package flamegraph

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"
)

// Parse reads a pprof profile (gzipped or not). It is a thin wrapper so
// callers need not import the profile package just to load a file.
func Parse(r io.Reader) (*profile.Profile, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("parse pprof profile: %w", err)
	}
	return p, nil
}

// SampleIndex returns the index of the sample type called name (for example
// "cpu", "samples", "alloc_space", "alloc_objects"). An empty name picks the
// profile's default sample type, or the last one, which is what pprof shows
// by default.
func SampleIndex(p *profile.Profile, name string) (int, error) {
	if len(p.SampleType) == 0 {
		return 0, fmt.Errorf("profile has no sample types")
	}
	if name == "" {
		name = p.DefaultSampleType
	}
	if name == "" {
		return len(p.SampleType) - 1, nil
	}
	var have []string
	for i, st := range p.SampleType {
		if st.Type == name {
			return i, nil
		}
		have = append(have, st.Type)
	}
	return 0, fmt.Errorf("sample type %q not in profile (have %s)", name, strings.Join(have, ", "))
}

// Unit returns the unit of sample type idx ("nanoseconds", "bytes", "count").
func Unit(p *profile.Profile, idx int) string {
	if idx < 0 || idx >= len(p.SampleType) {
		return ""
	}
	return p.SampleType[idx].Unit
}

// Stack is one distinct call stack, root first, with the summed value of all
// samples that had exactly this stack.
type Stack struct {
	Frames []string
	Value  int64
}

// frames returns the function names of a sample from leaf to root, expanding
// inlined calls: pprof stores a location's lines innermost first, and a
// sample's locations leaf first, so reading both in order yields leaf→root.
func frames(s *profile.Sample) []string {
	out := make([]string, 0, len(s.Location)*2)
	for _, loc := range s.Location {
		if len(loc.Line) == 0 {
			out = append(out, unsymbolized(loc))
			continue
		}
		for _, ln := range loc.Line {
			if ln.Function == nil || ln.Function.Name == "" {
				out = append(out, unsymbolized(loc))
				continue
			}
			out = append(out, ln.Function.Name)
		}
	}
	return out
}

// unsymbolized names a frame we have no function for, so it still shows up
// (as its address) instead of silently merging into its caller.
func unsymbolized(loc *profile.Location) string {
	return "0x" + strconv.FormatUint(loc.Address, 16)
}

// Fold sums sample values of sample type idx per distinct root→leaf stack.
// Stacks whose summed value is not positive are dropped: they cannot be drawn
// and only appear in delta profiles as sampling noise. The result is sorted
// by its folded text, so output is deterministic.
func Fold(p *profile.Profile, idx int) []Stack {
	sums := make(map[string]int64)
	for _, s := range p.Sample {
		if idx >= len(s.Value) {
			continue
		}
		fr := frames(s)
		if len(fr) == 0 {
			continue
		}
		// Reverse into root→leaf order and key by the folded line.
		rev := make([]string, len(fr))
		for i, f := range fr {
			rev[len(fr)-1-i] = sanitize(f)
		}
		sums[strings.Join(rev, ";")] += s.Value[idx]
	}
	keys := make([]string, 0, len(sums))
	for k, v := range sums {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]Stack, len(keys))
	for i, k := range keys {
		out[i] = Stack{Frames: strings.Split(k, ";"), Value: sums[k]}
	}
	return out
}

// sanitize keeps frame names safe for the folded format, where ';' separates
// frames and the last space separates the value.
func sanitize(name string) string {
	if !strings.ContainsAny(name, "; \n") {
		return name
	}
	return strings.NewReplacer(";", ":", "\n", " ").Replace(name)
}

// WriteFolded writes stacks in the "a;b;c value" format understood by
// flamegraph.pl, speedscope and inferno.
func WriteFolded(w io.Writer, stacks []Stack) error {
	bw := bufio.NewWriter(w)
	for _, s := range stacks {
		if _, err := fmt.Fprintf(bw, "%s %d\n", strings.Join(s.Frames, ";"), s.Value); err != nil {
			return fmt.Errorf("write folded stacks: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write folded stacks: %w", err)
	}
	return nil
}

// Total is the sum of the absolute sample values of type idx; it is the
// denominator pprof uses for its percentages.
func Total(p *profile.Profile, idx int) int64 {
	var t int64
	for _, s := range p.Sample {
		if idx < len(s.Value) {
			v := s.Value[idx]
			if v < 0 {
				v = -v
			}
			t += v
		}
	}
	return t
}

// FormatValue renders v in unit the way pprof does closely enough for a
// human: durations scaled to ns/us/ms/s, byte counts to B/kB/MB/GB (powers of
// 1024, as pprof does), anything else as a plain integer.
func FormatValue(v int64, unit string) string {
	neg := v < 0
	a := math.Abs(float64(v))
	var s string
	switch unit {
	case "nanoseconds":
		switch {
		case a >= 1e9:
			s = trim(a/1e9) + "s"
		case a >= 1e6:
			s = trim(a/1e6) + "ms"
		case a >= 1e3:
			s = trim(a/1e3) + "us"
		default:
			s = trim(a) + "ns"
		}
	case "bytes":
		switch {
		case a >= 1<<30:
			s = trim(a/(1<<30)) + "GB"
		case a >= 1<<20:
			s = trim(a/(1<<20)) + "MB"
		case a >= 1<<10:
			s = trim(a/(1<<10)) + "kB"
		default:
			s = trim(a) + "B"
		}
	default:
		s = strconv.FormatInt(int64(a), 10)
	}
	if neg {
		return "-" + s
	}
	return s
}

// trim prints with two decimals and drops trailing zeros ("1.50" → "1.5").
func trim(f float64) string {
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
