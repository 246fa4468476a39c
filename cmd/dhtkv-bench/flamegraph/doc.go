// Package flamegraph turns pprof profiles into the artefacts the benchmark
// reports need without shelling out to `go tool pprof` or to Perl scripts:
// folded stacks (root→leaf, one line per distinct stack), a self-contained SVG
// flame graph that opens in any browser (with zoom and search there), and a
// `pprof -top`-style text table.
//
// Everything is computed here from github.com/google/pprof/profile so the
// numbers in a report are reproducible from the raw profile alone and the
// benchmark driver has no dependency on tools that may be missing on the
// machine that runs it.
package flamegraph
