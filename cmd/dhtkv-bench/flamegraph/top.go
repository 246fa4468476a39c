package flamegraph

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// Row is one function of a top table. Flat is the value of samples whose
// leaf frame is this function; Cum is the value of samples that have the
// function anywhere on the stack (counted once per sample, so recursion does
// not inflate it). Inlined functions are rows of their own, as in pprof.
type Row struct {
	Name string
	Flat int64
	Cum  int64
}

// Rows computes flat and cumulative values per function for sample type idx,
// sorted by flat (descending), then cum, then name. total is the pprof-style
// denominator (sum of absolute sample values).
func Rows(p *profile.Profile, idx int) (rows []Row, total int64) {
	byName := make(map[string]*Row)
	get := func(name string) *Row {
		r := byName[name]
		if r == nil {
			r = &Row{Name: name}
			byName[name] = r
		}
		return r
	}
	seen := make(map[string]bool)
	for _, s := range p.Sample {
		if idx >= len(s.Value) {
			continue
		}
		v := s.Value[idx]
		fr := frames(s)
		if len(fr) == 0 {
			continue
		}
		get(fr[0]).Flat += v
		clear(seen)
		for _, f := range fr {
			if !seen[f] {
				seen[f] = true
				get(f).Cum += v
			}
		}
	}
	rows = make([]Row, 0, len(byName))
	for _, r := range byName {
		rows = append(rows, *r)
	}
	sortRows(rows, false)
	return rows, Total(p, idx)
}

func sortRows(rows []Row, byCum bool) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		ka1, kb1, ka2, kb2 := a.Flat, b.Flat, a.Cum, b.Cum
		if byCum {
			ka1, kb1, ka2, kb2 = a.Cum, b.Cum, a.Flat, b.Flat
		}
		if ka1 != kb1 {
			return ka1 > kb1
		}
		if ka2 != kb2 {
			return ka2 > kb2
		}
		return a.Name < b.Name
	})
}

// Top renders the n functions with the largest flat value as a text table in
// the layout of `go tool pprof -top` (flat, flat%, sum%, cum, cum%, name).
func Top(p *profile.Profile, idx, n int) string {
	return top(p, idx, n, false)
}

// TopCum is Top sorted by cumulative value, like `go tool pprof -top -cum`;
// it shows which call paths (handlers, middleware) own the time.
func TopCum(p *profile.Profile, idx, n int) string {
	return top(p, idx, n, true)
}

func top(p *profile.Profile, idx, n int, byCum bool) string {
	rows, total := Rows(p, idx)
	if byCum {
		sortRows(rows, true)
	}
	unit := Unit(p, idx)
	shown := rows
	if n > 0 && len(shown) > n {
		shown = shown[:n]
	}
	var b strings.Builder
	typ := ""
	if idx < len(p.SampleType) {
		typ = p.SampleType[idx].Type
	}
	fmt.Fprintf(&b, "Type: %s\n", typ)
	fmt.Fprintf(&b, "Showing top %d nodes out of %d (total %s)\n", len(shown), len(rows), FormatValue(total, unit))
	fmt.Fprintf(&b, "%10s %7s %7s %10s %7s  %s\n", "flat", "flat%", "sum%", "cum", "cum%", "name")
	var sum int64
	for _, r := range shown {
		sum += r.Flat
		fmt.Fprintf(&b, "%10s %7s %7s %10s %7s  %s\n",
			FormatValue(r.Flat, unit), pct(r.Flat, total), pct(sum, total),
			FormatValue(r.Cum, unit), pct(r.Cum, total), r.Name)
	}
	return b.String()
}

// pct formats part/total as a percentage with two decimals, "0%"-safe when
// the profile is empty.
func pct(part, total int64) string {
	if total == 0 {
		return "0.00%"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(part)/float64(total))
}
