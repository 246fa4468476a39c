package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dhtkvctl snapshot against a real node's admin listener: usage errors
// exit 2 before contacting it, the requests it refuses exit 5, and a
// snapshot prints where it went (or, with --json, the node's answer).
// The success path is skipped while the store cannot checkpoint (501).
func TestSnapshotCommand(t *testing.T) {
	snapshots := t.TempDir()
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.SnapshotDir = snapshots })
	admin := "--admin=" + c.Node(0).AdminAddr()
	existing := filepath.Join(snapshots, "existing")
	require.NoError(t, os.Mkdir(existing, 0o700))
	for _, s := range []step{
		{name: "no admin", args: []string{"snapshot", "--dir", "/x"}, code: exitUsage, errHas: "needs --admin"},
		{name: "no dir", args: []string{"snapshot", admin}, code: exitUsage, errHas: "needs --dir"},
		{name: "argument", args: []string{"snapshot", admin, "--dir", "/x", "extra"}, code: exitUsage, errHas: "no arguments"},
		{name: "outside --snapshot-dir", args: []string{"snapshot", admin, "--dir", filepath.Join(t.TempDir(), "x")}, code: exitBadRequest, errHas: "outside --snapshot-dir " + snapshots},
		{name: "escape", args: []string{"snapshot", admin, "--dir", "../x"}, code: exitBadRequest, errHas: "must not contain .."},
		{name: "existing dir", args: []string{"snapshot", admin, "--dir", existing}, code: exitBadRequest, errHas: "already exists"},
		{name: "no admin listener there", args: []string{"snapshot", "--admin", testcluster.DeadEndpoint(t), "--dir", "/x"}, code: exitError, errHas: "connection refused"},
		{name: "help", args: []string{"snapshot", "-h"}, outHas: []string{"--admin", "Backup and restore", "--snapshot-dir"}},
	} {
		s.run(t)
	}

	dir := filepath.Join(snapshots, "daily", "snap")
	var out, errb bytes.Buffer
	code := run([]string{"snapshot", admin, "--dir", dir}, nil, &out, &errb)
	if code == exitError && strings.Contains(errb.String(), ": 501 ") {
		t.Skipf("the store cannot checkpoint yet: %s", errb.String())
	}
	require.Equal(t, exitOK, code, errb.String())
	assert.Regexp(t, `^snapshot in `+regexp.QuoteMeta(dir)+`: \d+ files, \d+ bytes, [0-9.]+ s; complete as of \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n$`, out.String(),
		"a single node holds every write it acknowledged")
	assert.Empty(t, errb.String(), "no warning")
	manifests, err := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	require.NoError(t, err)
	assert.NotEmpty(t, manifests, "a Pebble directory")

	out.Reset()
	require.Equal(t, exitOK, run([]string{"snapshot", admin, "--dir", "daily/snap2", "--json"}, nil, &out, &errb), errb.String())
	var s client.Snapshot
	require.NoError(t, json.Unmarshal(out.Bytes(), &s))
	assert.Equal(t, filepath.Join(snapshots, "daily", "snap2"), s.Dir, "relative to --snapshot-dir")
	assert.Positive(t, s.Files)
}
