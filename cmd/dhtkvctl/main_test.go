package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// step is one dhtkvctl run and what it must do.
type step struct {
	name  string
	args  []string
	stdin string
	code  int
	out   string // exact stdout, unless outHas is set
	// outHas: substrings stdout must contain (then out is not checked)
	outHas []string
	// check, when set, is called with stdout (then out is not checked)
	check  func(t *testing.T, stdout string)
	errHas string // substring of stderr ("" : stderr must be empty)
}

func (s step) run(t *testing.T) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(s.args, strings.NewReader(s.stdin), &out, &errb)
	assert.Equal(t, s.code, code, "%s: exit code; stderr %q", s.name, errb.String())
	switch {
	case s.check != nil:
		s.check(t, out.String())
	case s.outHas != nil:
		for _, h := range s.outHas {
			assert.Contains(t, out.String(), h, s.name)
		}
	default:
		assert.Equal(t, s.out, out.String(), s.name)
	}
	if s.errHas == "" {
		assert.Empty(t, errb.String(), s.name)
	} else {
		assert.Contains(t, errb.String(), s.errHas, s.name)
		assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "%s: one line on stderr: %q", s.name, errb.String())
	}
}

// The commands and their exit codes against a real 3-node cluster, in
// order (the steps share the data): what scripts rely on.
func TestCommands(t *testing.T) {
	c := testcluster.Start(t, 3)
	c.AwaitReady(10 * time.Second) // status below expects no warning
	eps := "--endpoints=" + strings.Join([]string{c.URL(0), c.URL(1), c.URL(2)}, ",")
	dir := t.TempDir()
	file := filepath.Join(dir, "value")
	require.NoError(t, os.WriteFile(file, []byte("from a file\x00\xff"), 0o600))
	binKey := "bin\xff\x00key"
	scanJSON := `{"key_base64":"Ymlu/wBrZXk=","value_base64":"ZnJvbSBhIGZpbGUA/w=="}` + "\n" +
		`{"key":"k1","value":"v1"}` + "\n" +
		`{"key":"k2","value":"line 1\nline 2\n"}` + "\n"

	for _, s := range []step{
		{name: "put argument", args: []string{eps, "put", "k1", "v1"}, out: "OK\n"},
		{name: "get", args: []string{eps, "get", "k1"}, out: "v1"},
		{name: "put stdin", args: []string{eps, "put", "k2"}, stdin: "line 1\nline 2\n", out: "OK\n"},
		{name: "get stdin's value", args: []string{eps, "get", "k2"}, out: "line 1\nline 2\n"},
		{name: "put file", args: []string{eps, "put", "--file", file, binKey}, out: "OK\n"},
		{name: "get file's bytes", args: []string{eps, "get", binKey}, out: "from a file\x00\xff"},
		{name: "put empty value", args: []string{eps, "put", "k3", ""}, out: "OK\n"},
		{name: "get empty value", args: []string{eps, "get", "k3"}, out: ""},
		{name: "global flags after the command", args: []string{"get", eps, "--ack", "3", "k1"}, out: "v1"},
		{name: "negative ack", args: []string{eps, "--ack", "-1", "get", "k1"}, code: exitUsage, errHas: "--ack -1: want 0 (the node's default) or more"},
		{name: "get absent", args: []string{eps, "get", "absent"}, code: exitNotFound, errHas: "not found"},
		{name: "del", args: []string{eps, "del", "k3"}, out: "OK\n"},
		{name: "get deleted", args: []string{eps, "get", "k3"}, code: exitNotFound, errHas: "not found"},
		{name: "del absent", args: []string{eps, "del", "absent"}, out: "OK\n"},
		{name: "ack above from", args: []string{eps, "--ack", "3", "--from", "2", "get", "k1"}, code: exitBadRequest, errHas: "ack=3 exceeds from=2"},
		{name: "from above the cluster", args: []string{eps, "--from", "4", "put", "k1", "v"}, code: exitBadRequest, errHas: "from=4 exceeds the cluster's replication factor 3"},
		{name: "key too long", args: []string{eps, "get", strings.Repeat("k", 1025)}, code: exitBadRequest, errHas: "limit is 1024"},

		{name: "scan", args: []string{eps, "scan"}, out: "bin\xff\x00key\nfrom a file\x00\xff\nk1\nv1\nk2\nline 1\nline 2\n\n"},
		{name: "scan keys", args: []string{eps, "scan", "--keys-only"}, out: "bin\xff\x00key\nk1\nk2\n"},
		{name: "scan range", args: []string{eps, "scan", "--start", "k", "--end", "k2", "--keys-only"}, out: "k1\n"},
		{name: "scan limit", args: []string{eps, "scan", "--start", "k", "--limit", "1", "--keys-only"}, out: "k1\n"},
		{name: "scan local", args: []string{eps, "scan", "--local", "--start", "k", "--keys-only"}, out: "k1\nk2\n"},
		{name: "scan json", args: []string{eps, "scan", "--json"}, out: scanJSON},
		{name: "scan json keys", args: []string{eps, "scan", "--json", "--keys-only", "--start", "k"}, out: "{\"key\":\"k1\"}\n{\"key\":\"k2\"}\n"},
	} {
		s.run(t)
	}

	c.StopNode(2)
	for _, s := range []step{
		{name: "one node down: failover", args: []string{"--endpoints", c.URL(2) + "," + c.URL(0), "get", "k1"}, out: "v1"},
		{name: "3 of 3 with a node down", args: []string{eps, "--ack", "3", "get", "k1"}, code: exitNotEnoughReplicas, errHas: "not enough replicas"},
		{name: "scan 3 of 3 with a node down", args: []string{eps, "--ack", "3", "scan"}, code: exitNotEnoughReplicas, errHas: "not enough replicas"},
		{name: "no endpoint answers", args: []string{"--endpoints", c.URL(2), "get", "k1"}, code: exitError, errHas: "connection refused"},
		{name: "status with a node down", args: []string{eps, "status"}, code: exitError, errHas: "1 of 3 endpoints did not answer",
			check: func(t *testing.T, out string) {
				rows := table(out)
				require.Len(t, rows, 4, out)
				assert.Equal(t, []string{"ENDPOINT", "REACHABLE", "VERSION", "UPTIME", "EPOCH", "REBUILDING", "UP", "HINTS", "SYNCED", "DISK", "WARNINGS"}, rows[0])
				for i, want := range []string{"yes", "yes", "no"} {
					assert.Equal(t, c.URL(i), rows[i+1][0], out)
					assert.Equal(t, want, rows[i+1][1], out)
				}
				// UP depends on whether node 0 has probed node 2 since it
				// stopped; no anti-entropy exchange ran (the test cluster's
				// --ae-interval is 0).
				assert.Regexp(t, `^[123]/3$`, rows[1][6])
				assert.Equal(t, []string{buildinfo.Version(), "1", "false", "0B", "never", "-"}, []string{rows[1][2], rows[1][4], rows[1][5], rows[1][7], rows[1][8], rows[1][10]})
				assert.Regexp(t, `^\d+%$`, rows[1][9], "DISK: the share of the volume free")
				assert.Contains(t, out, "connection refused")
			}},
	} {
		s.run(t)
	}
	c.StartNode(2)
	c.AwaitReady(10 * time.Second)
	step{name: "status", args: []string{eps, "status"}, outHas: []string{c.URL(0), c.URL(1), c.URL(2)}}.run(t)

	var out bytes.Buffer
	require.Equal(t, exitOK, run([]string{eps, "status", "--json"}, nil, &out, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	for i, l := range lines {
		var es endpointStatus
		require.NoError(t, json.Unmarshal([]byte(l), &es), l)
		assert.Equal(t, c.URL(i), es.Endpoint)
		assert.True(t, es.Reachable)
		require.NotNil(t, es.Status)
		assert.Equal(t, c.URL(i), es.Status.Node)
		assert.Len(t, es.Status.Members, 3)
	}
}

// A value over the node's --max-value-bytes exits 5 with the node's 413
// and reason, and goes to no other endpoint, even from a node that closes
// at once (--linger-timeout 0): one byte over the default 16 MiB used to
// come back as a connection reset, fail over to the next endpoint, and
// exit 1.
func TestPutValueTooLarge(t *testing.T) {
	const limit = 16 << 20
	c := testcluster.Start(t, 2, func(_ int, cfg *node.Config) {
		cfg.MaxValueBytes = limit
		cfg.LingerTimeout = 0
	})
	file := filepath.Join(t.TempDir(), "value")
	require.NoError(t, os.WriteFile(file, make([]byte, limit+1), 0o600))
	eps := "--endpoints=" + c.URL(0) + "," + c.URL(1)
	for range 3 {
		step{name: "put too large", args: []string{eps, "put", "--file", file, "big"}, code: exitBadRequest,
			errHas: "refused (413): value too large: limit is 16777216 bytes"}.run(t)
	}
	assert.Zero(t, c.Metric(t, 1, "dhtkv_requests_total", "op", "put"), "the other endpoint was not asked")
	step{name: "get", args: []string{eps, "get", "big"}, code: exitNotFound, errHas: "not found"}.run(t)
}

// DHTKV_ENDPOINTS (and the other DHTKV_ variables) stand in for the global
// flags; a flag on the command line wins.
func TestEndpointsFromEnvironment(t *testing.T) {
	c := testcluster.Start(t, 1)
	t.Setenv("DHTKV_ENDPOINTS", c.URL(0))
	step{name: "put", args: []string{"put", "k", "v"}, out: "OK\n"}.run(t)
	step{name: "get", args: []string{"get", "k"}, out: "v"}.run(t)
	t.Setenv("DHTKV_ACK", "2")
	step{name: "env ack", args: []string{"get", "k"}, code: exitBadRequest, errHas: "ack=2 exceeds from=1"}.run(t)
	step{name: "flag wins", args: []string{"--ack", "1", "get", "k"}, out: "v"}.run(t)
	step{name: "put 2 KiB", args: []string{"--ack", "1", "put", "big", strings.Repeat("v", 2048)}, out: "OK\n"}.run(t)
	t.Setenv("DHTKV_MAX_ANSWER_BYTES", "1KiB")
	step{name: "an answer over the bound", args: []string{"--ack", "1", "get", "big"}, code: exitError,
		errHas: "answer larger than Config.MaxRecordBytes: 2048 bytes announced, limit 1024 (--max-answer-bytes)"}.run(t)
	step{name: "the bound raised", args: []string{"--ack", "1", "--max-answer-bytes", "2KiB", "get", "big"}, out: strings.Repeat("v", 2048)}.run(t)
	t.Setenv("DHTKV_ENDPOINTS", testcluster.DeadEndpoint(t))
	step{name: "flag wins over the environment", args: []string{"--endpoints", c.URL(0), "--ack", "1", "get", "k"}, out: "v"}.run(t)
}

// Usage errors exit 2 before contacting anything; -h exits 0 with the
// exit codes in the help.
func TestUsage(t *testing.T) {
	eps := "--endpoints=" + testcluster.DeadEndpoint(t)
	for _, s := range []step{
		{name: "no command", args: []string{eps}, code: exitUsage, errHas: "no command"},
		{name: "unknown command", args: []string{eps, "frobnicate"}, code: exitUsage, errHas: `unknown command "frobnicate"`},
		{name: "unknown flag", args: []string{"--bogus", "get", "k"}, code: exitUsage, errHas: "flag provided but not defined"},
		{name: "bad flag value", args: []string{"--ack", "two", "get", "k"}, code: exitUsage, errHas: "invalid value"},
		{name: "get without key", args: []string{eps, "get"}, code: exitUsage, errHas: "get takes one KEY"},
		{name: "get two keys", args: []string{eps, "get", "a", "b"}, code: exitUsage, errHas: "get takes one KEY"},
		{name: "del without key", args: []string{eps, "del"}, code: exitUsage, errHas: "del takes one KEY"},
		{name: "put without key", args: []string{eps, "put"}, code: exitUsage, errHas: "put takes KEY [VALUE]"},
		{name: "put value and file", args: []string{eps, "put", "--file", "f", "k", "v"}, code: exitUsage, errHas: "not both"},
		{name: "flag after arguments", args: []string{eps, "put", "k", "v", "--file", "f"}, code: exitUsage, errHas: "put takes KEY [VALUE], not 4"},
		{name: "scan argument", args: []string{eps, "scan", "k"}, code: exitUsage, errHas: "scan takes no arguments"},
		{name: "negative limit", args: []string{eps, "scan", "--limit", "-1"}, code: exitUsage, errHas: "--limit"},
		// The flag package takes these; the node answers 400 to a
		// negative ack or from, and the client used to drop them for the
		// node's default (exit 0).
		{name: "negative ack", args: []string{eps, "--ack", "-1", "get", "k"}, code: exitUsage, errHas: "--ack -1: want 0 (the node's default) or more"},
		{name: "negative from after the command", args: []string{eps, "get", "--from", "-2", "k"}, code: exitUsage, errHas: "--from -2: want 0 (the node's default) or more"},
		{name: "negative timeout", args: []string{eps, "--timeout", "-1s", "get", "k"}, code: exitUsage, errHas: "--timeout -1s: want 0 (no deadline) or more"},
		{name: "no answer bytes", args: []string{eps, "--max-answer-bytes", "0", "get", "k"}, code: exitUsage, errHas: "--max-answer-bytes 0: want 1 or more"},
		{name: "no wait timeout", args: []string{eps, "join", "--admin", "127.0.0.1:1", "--wait-timeout", "0s", "http://127.0.0.1:2"}, code: exitUsage,
			errHas: "--wait-timeout 0s: want more than 0 (--no-wait does not wait)"},
		{name: "negative wait timeout", args: []string{eps, "replicas", "--admin", "127.0.0.1:1", "--wait-timeout", "-1m", "2"}, code: exitUsage,
			errHas: "--wait-timeout -1m0s: want more than 0"},
		{name: "empty endpoints", args: []string{"--endpoints", " , ", "get", "k"}, code: exitUsage, errHas: "--endpoints is empty"},
		{name: "bad endpoint", args: []string{"--endpoints", "ftp://x:1", "get", "k"}, code: exitUsage, errHas: "want http://host:port"},
		{name: "missing file", args: []string{eps, "put", "--file", filepath.Join(t.TempDir(), "absent"), "k"}, code: exitError, errHas: "no such file"},
		{name: "help", args: []string{"-h"}, outHas: []string{"EXIT CODES", "3  not found", "4  not enough replicas", "5  request refused", "DHTKV_ENDPOINTS", "scan", "status"}},
		{name: "command help", args: []string{"scan", "-h"}, outHas: []string{"--limit is applied by the node", "-keys-only"}},
		{name: "version", args: []string{"--version"}, out: fmt.Sprintf("dhtkvctl %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())},
	} {
		s.run(t)
	}
	t.Setenv("DHTKV_ACK", "-1")
	step{name: "negative ack from the environment", args: []string{eps, "get", "k"}, code: exitUsage, errHas: "--ack -1: want 0"}.run(t)
}

// A node that accepts and never answers: --timeout ends the command.
func TestTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	step{name: "timeout", args: []string{"--endpoints", l.Addr().String(), "--timeout", "100ms", "get", "k"},
		code: exitError, errHas: "deadline exceeded"}.run(t)
}

// table splits a status table into its rows' fields.
func table(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

// DHTKV_VERSION is what builds and deployments name the version of dhtkv
// they deploy (packaging/compose.yaml: DHTKV_VERSION=$(git describe ...)).
// ff maps it to the root's --version flag, a boolean: with a version
// exported there, every dhtkvctl command failed with exit 2 before doing
// anything (buildinfo.Flag).
func TestVersionVariableIsNotTheFlag(t *testing.T) {
	_, ep := testcluster.Single(t)
	t.Setenv("DHTKV_VERSION", "v0.4.0-3-gdeadbee")
	step{name: "put with DHTKV_VERSION exported", args: []string{"--endpoints", ep, "put", "k", "v"}, out: "OK\n"}.run(t)
	step{name: "get with DHTKV_VERSION exported", args: []string{"--endpoints", ep, "get", "k"}, out: "v"}.run(t)
	step{name: "--version=maybe is still a usage error", args: []string{"--version=maybe"}, code: exitUsage, errHas: "version"}.run(t)
}
