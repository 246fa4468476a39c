package main

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// buildCtl compiles this command into a temporary directory.
func buildCtl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dhtkvctl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// ctl runs the binary and returns its stdout, stderr and exit code.
func ctl(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), errb.String(), exit.ExitCode()
	}
	require.NoError(t, err)
	return out.String(), errb.String(), 0
}

// TestProcessScan runs the dhtkvctl binary against a real 3-node cluster:
// scan --json prints exactly the API's format=json body, in both scopes,
// with --limit applied by the node and keys that are not UTF-8 or hold
// newlines; and the exit codes scripts see are the process's.
func TestProcessScan(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs dhtkvctl: a process test; runs without -short")
	}
	bin := buildCtl(t)
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	for k, v := range map[string]string{
		"a": "1", "b\nnewline": "two\nlines", "c\xff\x00": "\xfe", "d\"q\\": "\x00\t", "e": "", "f": "six", "gone": "x",
	} {
		require.Equal(t, 201, cl.Put(t, c.URL(0), k, []byte(v), 0, 0))
	}
	require.Equal(t, 202, cl.Delete(t, c.URL(1), "gone", 0, 0))
	eps := "--endpoints=" + c.URL(1) + "," + c.URL(2)

	body := func(query string) string {
		resp := testcluster.HTTPGet(t, c.URL(1)+"/v0/entities?format=json&"+query)
		require.Equal(t, 200, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	for _, tc := range []struct {
		args  []string
		query string
		lines int
	}{
		{[]string{"scan", "--json"}, "scope=cluster&start=%00", 6},
		{[]string{"scan", "--json", "--limit", "2"}, "scope=cluster&start=%00&limit=2", 2},
		{[]string{"scan", "--json", "--start", "c", "--limit", "3"}, "scope=cluster&start=c&limit=3", 3},
		{[]string{"scan", "--json", "--local", "--end", "e"}, "start=%00&end=e", 4},
		{[]string{"scan", "--json", "--local", "--start", "b", "--limit", "1"}, "start=b&limit=1", 1},
	} {
		out, stderr, code := ctl(t, bin, append([]string{eps}, tc.args...)...)
		require.Equal(t, 0, code, "%v: %s", tc.args, stderr)
		require.Equal(t, body(tc.query), out, "%v", tc.args)
		require.Equal(t, tc.lines, strings.Count(out, "\n"), "%v: %s", tc.args, out)
	}
	out, _, code := ctl(t, bin, eps, "scan", "--keys-only", "--start", "e", "--limit", "2")
	require.Equal(t, 0, code)
	require.Equal(t, "e\nf\n", out)

	_, stderr, code := ctl(t, bin, eps, "get", "gone")
	require.Equal(t, exitNotFound, code, stderr)
	_, stderr, code = ctl(t, bin, eps, "scan", "--limit", "1000000001")
	require.Equal(t, exitBadRequest, code, stderr)
	require.Contains(t, stderr, "limit")
	_, stderr, code = ctl(t, bin, eps, "scan", "--start", "x", "extra")
	require.Equal(t, exitUsage, code, stderr)
}
