package history

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt")

// TestChecks runs the cases of testdata/*.txt. A case is a hand-built
// history and the violations every check reports for it:
//
//	case <name>
//	<call ms> <return ms> <client> write <key> <value> ok|failed|unknown
//	<call ms> <return ms> <client> delete <key> ok|failed|unknown
//	<call ms> <return ms> <client> read <key> <value>|notfound|failed|unknown
//	final <key> <value>|notfound
//	----
//	<one violation a line, or "ok", or "error: ..." for a malformed history>
//
// ending at a blank line. Ops get ids in line order. The checks run are
// CheckReads, CheckMonotonic, CheckFinal (if the case has final lines) and
// CheckLinearizable, in that order. Lines outside cases are comments.
// go test -run TestChecks -args -rewrite regenerates the expected output.
func TestChecks(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) { runCheckFile(t, path) })
	}
}

func runCheckFile(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out strings.Builder
	for i := 0; i < len(lines); {
		name, ok := strings.CutPrefix(lines[i], "case ")
		if !ok {
			out.WriteString(lines[i] + "\n")
			i++
			continue
		}
		start := i
		for i < len(lines) && lines[i] != "----" {
			i++
		}
		require.Less(t, i, len(lines), "%s:%d: case %s has no ----", path, start+1, name)
		input := lines[start+1 : i]
		i++
		wantStart := i
		for i < len(lines) && lines[i] != "" {
			i++
		}
		want := strings.Join(lines[wantStart:i], "\n")
		got := runCase(t, fmt.Sprintf("%s:%d", path, start+1), input)
		if *rewrite {
			fmt.Fprintf(&out, "%s\n----\n%s\n", strings.Join(lines[start:start+1+len(input)], "\n"), got)
			continue
		}
		t.Run(name, func(t *testing.T) {
			require.Equal(t, want, got, "%s:%d", path, start+1)
		})
	}
	if *rewrite {
		require.NoError(t, os.WriteFile(path, []byte(out.String()), 0o644))
	}
}

// runCase checks one case's history and renders what the checks report.
func runCase(t *testing.T, where string, input []string) string {
	ops, final, err := parseCase(input)
	require.NoError(t, err, where)
	var lines []string
	add := func(vs []Violation, err error) {
		if err != nil {
			lines = append(lines, "error: "+err.Error())
		}
		for _, v := range vs {
			lines = append(lines, v.String())
		}
	}
	reads, rerr := CheckReads(ops)
	if rerr != nil {
		return "error: " + rerr.Error() // every check validates the same way
	}
	add(reads, nil)
	mono, err := CheckMonotonic(ops)
	add(mono, err)
	if final != nil {
		add(CheckFinal(ops, final))
	}
	lin, err := CheckLinearizable(ops, 10*time.Second)
	add(lin, err)
	if v, bad := unconfirmed(append(reads, mono...), lin); bad {
		t.Errorf("%s: %v, yet porcupine finds the key linearizable", where, v)
	}
	if len(lines) == 0 {
		return "ok"
	}
	return strings.Join(lines, "\n")
}

// unconfirmed returns a violation of CheckReads or CheckMonotonic (in vs)
// on a key that CheckLinearizable (lin) finds linearizable, if there is one.
// Those rules are consequences of linearizability, so porcupine's
// exhaustive search would confirm every true violation: an unconfirmed one
// is a false alarm.
func unconfirmed(vs, lin []Violation) (Violation, bool) {
	nonLin := map[string]bool{}
	for _, v := range lin {
		nonLin[v.Key] = true
	}
	for _, v := range vs {
		if !nonLin[v.Key] {
			return v, true
		}
	}
	return Violation{}, false
}

// parseCase reads a case's op and final lines (see TestChecks).
func parseCase(input []string) ([]Op, map[string]Final, error) {
	var ops []Op
	var final map[string]Final
	for _, line := range input {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "final" {
			if len(f) != 3 {
				return nil, nil, fmt.Errorf("%q: want final <key> <value>|notfound", line)
			}
			if final == nil {
				final = map[string]Final{}
			}
			final[f[1]] = Final{Found: f[2] != "notfound", Value: strings.TrimPrefix(f[2], "notfound")}
			continue
		}
		op, err := parseOp(f)
		if err != nil {
			return nil, nil, fmt.Errorf("%q: %w", line, err)
		}
		op.ID = len(ops)
		ops = append(ops, op)
	}
	return ops, final, nil
}

func parseOp(f []string) (Op, error) {
	if len(f) < 5 {
		return Op{}, fmt.Errorf("too few fields")
	}
	call, err1 := strconv.Atoi(f[0])
	ret, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return Op{}, fmt.Errorf("times must be whole milliseconds")
	}
	op := Op{Client: f[2], Key: f[4], Call: time.Duration(call) * time.Millisecond, Return: time.Duration(ret) * time.Millisecond}
	args := f[5:]
	switch f[3] {
	case "write":
		if len(args) != 2 {
			return Op{}, fmt.Errorf("want write <key> <value> <outcome>")
		}
		op.Kind, op.Value, op.Outcome = Write, args[0], Outcome(args[1])
	case "delete":
		if len(args) != 1 {
			return Op{}, fmt.Errorf("want delete <key> <outcome>")
		}
		op.Kind, op.Delete, op.Outcome = Write, true, Outcome(args[0])
	case "read":
		if len(args) != 1 {
			return Op{}, fmt.Errorf("want read <key> <value>|notfound|failed|unknown")
		}
		op.Kind, op.Outcome = Read, OK
		switch args[0] {
		case "notfound":
		case string(Failed), string(Unknown):
			op.Outcome = Outcome(args[0])
		default:
			op.Found, op.Value = true, args[0]
		}
	default:
		return Op{}, fmt.Errorf("unknown operation %q", f[3])
	}
	return op, nil
}
