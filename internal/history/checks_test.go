package history

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestChecks runs the datadriven cases of testdata/*. A case, named by the
// # comment above it, is a check directive whose input is a hand-built
// history, one event a line, and whose output is the violations every
// check reports for it:
//
//	check
//	<call ms> <return ms> <client> write <key> <value> ok|failed|unknown
//	<call ms> <return ms> <client> delete <key> ok|failed|unknown
//	<call ms> <return ms> <client> read <key> <value>|notfound|failed|unknown
//	final <key> <value>|notfound
//	----
//	<one violation a line, or "ok", or "error: ..." for a malformed history>
//
// Ops get ids in line order. The checks run are CheckReads, CheckMonotonic,
// CheckFinal (if the case has final lines) and CheckLinearizable, in that
// order. Rewrite the expected output after a deliberate change with
// go test ./internal/history -run TestChecks -rewrite.
func TestChecks(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "check" || len(d.CmdArgs) > 0 {
				d.Fatalf(t, "unknown directive %q: want check", d.FullCmd())
			}
			ops, final, err := parseCase(strings.Split(d.Input, "\n"))
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			return runCase(t, d, ops, final)
		})
	})
}

// runCase checks one case's history and renders what the checks report.
func runCase(t *testing.T, d *datadriven.TestData, ops []Op, final map[string]Final) string {
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
		d.Fatalf(t, "%v, yet porcupine finds the key linearizable", v)
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
