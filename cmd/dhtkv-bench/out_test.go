package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A quick run never writes the committed reports of a full run
// (docs/reports): by default it writes bench-quick-out, and it refuses
// docs/reports however it is named. A full run writes docs/reports by
// default, and either goes where --out says otherwise.
func TestQuickRunKeepsOffDocsReports(t *testing.T) {
	root := testRepo(t)
	t.Chdir(root) // where make bench runs the driver
	other := t.TempDir()
	for _, tc := range []struct {
		name    string
		args    []string
		out     string // want cfg.Out, relative to the repository unless absolute
		refused bool
	}{
		{name: "full, default", args: nil, out: "docs/reports"},
		{name: "quick, default", args: []string{"--quick"}, out: "bench-quick-out"},
		{name: "quick, docs/reports", args: []string{"--quick", "--out", "docs/reports"}, refused: true},
		{name: "quick, docs/reports/", args: []string{"--quick", "--out", "docs/reports/"}, refused: true},
		{name: "quick, ./docs/../docs/reports", args: []string{"--quick", "--out", "./docs/../docs/reports"}, refused: true},
		{name: "quick, absolute docs/reports", args: []string{"--quick", "--out", filepath.Join(root, "docs", "reports")}, refused: true},
		{name: "quick, --out after --quick wins", args: []string{"--out", other, "--quick", "--out", "docs/reports"}, refused: true},
		{name: "quick, elsewhere", args: []string{"--quick", "--out", other}, out: other},
		{name: "full, elsewhere", args: []string{"--out", other}, out: other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args)
			if tc.refused {
				if err == nil || !strings.Contains(err.Error(), "committed reports") {
					t.Fatalf("parseFlags(%q) = out %s, err %v; want refused", tc.args, cfg.Out, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.out
			if !filepath.IsAbs(want) {
				want = filepath.Join(root, want)
			}
			if cfg.Out != want {
				t.Errorf("parseFlags(%q).Out = %s, want %s", tc.args, cfg.Out, want)
			}
		})
	}
}

// make bench-quick passes the driver an --out it accepts, not
// docs/reports; make bench passes docs/reports.
func TestMakeBenchOut(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	root := testRepo(t)
	t.Chdir(root)
	for _, tc := range []struct {
		target string
		out    string
	}{
		{"bench", "docs/reports"},
		{"bench-quick", "bench-quick-out"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			// -n: print the recipe; -o: without the builds it depends on.
			cmd := exec.Command("make", "-n", "-o", "build", "-o", "bench-driver", tc.target)
			for _, kv := range cmd.Environ() { // the Makefile's defaults, not the caller's
				if !strings.HasPrefix(kv, "BENCH_") && !strings.HasPrefix(kv, "MAKE") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			b, err := cmd.Output()
			if err != nil {
				t.Fatalf("make -n %s: %v", tc.target, err)
			}
			var args []string
			for _, line := range strings.Split(string(b), "\n") {
				if _, rest, ok := strings.Cut(line, "/dhtkv-bench "); ok {
					args = strings.Fields(rest)
				}
			}
			if args == nil {
				t.Fatalf("make -n %s runs no dhtkv-bench:\n%s", tc.target, b)
			}
			cfg, err := parseFlags(args)
			if err != nil {
				t.Fatalf("make %s: dhtkv-bench %q: %v", tc.target, args, err)
			}
			if want := filepath.Join(root, tc.out); cfg.Out != want {
				t.Errorf("make %s writes %s, want %s", tc.target, cfg.Out, want)
			}
		})
	}
}

// testRepo is the repository's root, from the package's directory.
func testRepo(t *testing.T) string {
	t.Helper()
	wd, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	return repoRoot(wd)
}
