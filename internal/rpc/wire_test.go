package rpc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/dhtkv/dhtkv/internal/record"
)

// TestWire runs the cases of testdata/wire: how batches and answers are
// encoded, and which malformed ones are refused. Commands:
//
//	encode            one operation per line, "read KEY" or
//	                  "write KEY VERSION VALUE|tombstone"; prints the body
//	                  as a Go string, then what ParseBatch reads back.
//	parse             the input is a Go-quoted body; prints the
//	                  operations ParseBatch reads, or its error.
//	answer            the input is a Go-quoted answer; prints the results
//	                  nextResult reads, or its error.
//
// Rewrite the expected output after a deliberate change with
// go test ./internal/rpc -run TestWire -rewrite.
func TestWire(t *testing.T) {
	datadriven.RunTest(t, "testdata/wire", func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "encode":
			var body []byte
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				f := strings.Fields(line)
				switch {
				case len(f) == 2 && f[0] == "read":
					body = AppendBatchOp(body, OpRead, []byte(f[1]), nil)
				case len(f) == 4 && f[0] == "write":
					v, err := strconv.ParseUint(f[2], 10, 64)
					if err != nil {
						d.Fatalf(t, "version: %v", err)
					}
					rec := record.Record{Version: v, Tombstone: f[3] == "tombstone"}
					if !rec.Tombstone {
						rec.Value = []byte(f[3])
					}
					body = AppendBatchOp(body, OpWrite, []byte(f[1]), rec.Encode())
				default:
					d.Fatalf(t, "bad operation %q", line)
				}
			}
			return fmt.Sprintf("%q\n", body) + printBatch(body)
		case "parse":
			return printBatch(unquote(t, d))
		case "answer":
			return printAnswer(unquote(t, d))
		}
		d.Fatalf(t, "unknown command %q", d.Cmd)
		return ""
	})
}

func unquote(t *testing.T, d *datadriven.TestData) []byte {
	s, err := strconv.Unquote(strings.TrimSpace(d.Input))
	if err != nil {
		d.Fatalf(t, "input is not a Go string: %v", err)
	}
	return []byte(s)
}

func printBatch(body []byte) string {
	ops, err := ParseBatch(body, nil)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	var b strings.Builder
	for _, op := range ops {
		if op.Kind == OpRead {
			fmt.Fprintf(&b, "read %q\n", op.Key)
			continue
		}
		rec, err := record.Decode(op.Envelope)
		if err != nil {
			fmt.Fprintf(&b, "write %q envelope error: %v\n", op.Key, err)
			continue
		}
		fmt.Fprintf(&b, "write %q version=%d tombstone=%t value=%q\n", op.Key, rec.Version, rec.Tombstone, rec.Value)
	}
	return b.String()
}

func printAnswer(buf []byte) string {
	var b strings.Builder
	for len(buf) > 0 {
		r, rest, err := nextResult(buf)
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
			break
		}
		switch r.code {
		case ResFound:
			fmt.Fprintf(&b, "found envelope=%q\n", r.envelope)
		case ResNotFound:
			b.WriteString("not found\n")
		case ResApplied:
			b.WriteString("applied\n")
		case ResNewer:
			fmt.Fprintf(&b, "refused: holds version %d\n", r.version)
		case ResError:
			fmt.Fprintf(&b, "error result: %s\n", r.msg)
		case ResRefused:
			fmt.Fprintf(&b, "refused result: %s\n", r.msg)
		case ResOverLimit:
			b.WriteString("over the answer's limit: ask again\n")
		case ResNoSpace:
			fmt.Fprintf(&b, "no space result: %s\n", r.msg)
		}
		buf = rest
	}
	return b.String()
}
