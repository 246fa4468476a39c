package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// proc is a dhtkv process under test.
type proc struct {
	cmd  *exec.Cmd
	base string
	log  *bytes.Buffer
}

func startProc(t *testing.T, bin, dir string, port int, extra ...string) *proc {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{"--listen", addr, "--data-dir", dir}, extra...)
	cmd := exec.Command(bin, args...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, base: "http://" + addr, log: &log}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	testcluster.WaitReady(t, p.base, 15*time.Second)
	return p
}

// The default --sync=true promise: a PUT acknowledged with 201 survives
// SIGKILL of the process. Many concurrent clients write; the process is
// killed while they are still writing; every key acknowledged before the
// kill must be there after restart with its value.
func TestAcknowledgedWritesSurviveSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the binary under writes: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	dir := t.TempDir()
	port := testcluster.FreePorts(t, 1)[0]
	p := startProc(t, bin, dir, port) // default --sync=true

	var mu sync.Mutex
	acked := map[string]string{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &http.Client{Timeout: 5 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("c%d-k%d", c, i), fmt.Sprintf("value-%d-%d", c, i)
				req, _ := http.NewRequest(http.MethodPut, testcluster.EntityURL(p.base, k, 0, 0), strings.NewReader(v))
				resp, err := cl.Do(req)
				if err != nil {
					return // the process died under us: not acknowledged
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
				}
			}
		}()
	}
	// Let writes flow, then kill without warning while they continue.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 300 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, len(acked), 300)

	p2 := startProc(t, bin, dir, port)
	cl := testcluster.NewClient(t)
	for k, v := range acked {
		code, body := cl.Get(t, p2.base, k, 0, 0)
		require.Equal(t, 200, code, "acknowledged key %s lost after SIGKILL", k)
		require.Equal(t, v, string(body))
	}
	t.Logf("%d acknowledged writes all present after SIGKILL", len(acked))
}

// Graceful stop and restart on the same directory keeps the data; a new
// directory starts empty.
func TestRestartKeepsData(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	dir := t.TempDir()
	port := testcluster.FreePorts(t, 1)[0]
	cl := testcluster.NewClient(t)

	p := startProc(t, bin, dir, port)
	require.Equal(t, 201, cl.Put(t, p.base, "kept", []byte("v1"), 0, 0))
	require.Equal(t, 201, cl.Put(t, p.base, "gone", []byte("x"), 0, 0))
	require.Equal(t, 202, cl.Delete(t, p.base, "gone", 0, 0))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.cmd.Wait(), "SIGTERM exits 0; log:\n%s", p.log)
	assert.Contains(t, p.log.String(), "dhtkv node stopped")

	p = startProc(t, bin, dir, port)
	code, body := cl.Get(t, p.base, "kept", 0, 0)
	require.Equal(t, 200, code)
	require.Equal(t, "v1", string(body))
	code, _ = cl.Get(t, p.base, "gone", 0, 0)
	require.Equal(t, 404, code, "the tombstone survives restart")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, p.cmd.Wait())

	require.NoError(t, os.RemoveAll(dir))
	p = startProc(t, bin, dir, port)
	code, _ = cl.Get(t, p.base, "kept", 0, 0)
	require.Equal(t, 404, code, "a deleted data directory means no data")
}

// TestFlags: a flag that does not parse, or a setting Config.Validate
// refuses, is a usage error (2, before anything starts); a configuration
// that fails when the node starts exits 1; either way one line says why.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--cache-bytes", "lots"}, 2, "invalid value"},
		{[]string{"--sync=maybe"}, 2, "invalid boolean"},
		{[]string{"--read-repair", "sometimes"}, 2, "want blocking, async or off"},
		{[]string{"extra-arg"}, 2, "unexpected argument"},
		{[]string{"--log-level", "loud"}, 2, "log-level"},
		{[]string{"--log-format", "xml"}, 2, "log-format"},
		{[]string{"--memtable-bytes", "0"}, 2, "memtable"},
		{[]string{"--l0-compaction-threshold", "0"}, 2, "l0-compaction-threshold"},
		{[]string{"--shutdown-timeout", "0"}, 2, "--shutdown-timeout 0s: must be positive"},
		{[]string{"--shutdown-timeout", "-1s"}, 2, "--shutdown-timeout -1s: must be positive"},
		{[]string{"--listen", "127.0.0.1:0", "--cluster", "http://127.0.0.1:1,http://127.0.0.1:2", "--self", "http://127.0.0.1:3"}, 1, "is not in --cluster"},
		{[]string{"--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:1"}, 1, "bad node URL"},
		{[]string{"--listen", "127.0.0.1:0", "--replica-timeout", "0s"}, 2, "replica-timeout"},
		{[]string{"--listen", "127.0.0.1:0", "--peer-conns", "0"}, 2, "peer-conns"},
		{[]string{"--listen", "127.0.0.1:0", "--max-key-bytes", "0"}, 2, "limits"},
		{[]string{"--listen", "127.0.0.1:0", "--max-connections", "-1"}, 2, "max-connections"},
		{[]string{"--listen", "127.0.0.1:0", "--max-connections-per-ip", "-1"}, 2, "max-connections-per-ip"},
		{[]string{"--listen", "127.0.0.1:0", "--max-value-bytes", "300000000"}, 2, "--max-inflight-body-bytes 268435456 must be 0 or hold the largest request body"},
		{[]string{"--listen", "127.0.0.1:0", "--max-inflight-response-bytes", "1MiB"}, 2, "--max-inflight-response-bytes 1048576 must be 0 or hold the largest value, 16777216 bytes"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"--data-dir", t.TempDir()}, tc.args...)
		code := run(args, &out, &errb)
		assert.Equal(t, tc.code, code, "%v", tc.args)
		assert.Contains(t, errb.String(), tc.msg, "%v", tc.args)
		assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "%v: one line: %q", tc.args, errb.String())
	}
	var out bytes.Buffer
	require.Equal(t, 0, run([]string{"-h"}, &out, &out))
	for _, f := range []string{"--listen", "-data-dir", "-admin-listen", "-cache-bytes", "-sync", "-max-key-bytes", "-max-value-bytes", "-cluster", "-self", "-replica-timeout", "-cluster-secret"} {
		assert.Contains(t, out.String(), strings.TrimLeft(f, "-"))
	}
}

// --version prints the build's version and Go release, starts nothing, and
// exits 0.
func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, &out, &errb))
	assert.Equal(t, fmt.Sprintf("dhtkv %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion()), out.String())
	assert.Empty(t, errb.String())
}

// A second node on a data directory another dhtkv process serves says so,
// in one line, and exits 1; the first node goes on serving.
func TestDataDirInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	dir := t.TempDir()
	p := startProc(t, bin, dir, testcluster.FreePorts(t, 1)[0])

	var out, errb bytes.Buffer
	code := run([]string{"--listen", "127.0.0.1:0", "--data-dir", dir}, &out, &errb)
	assert.Equal(t, 1, code)
	assert.Equal(t, fmt.Sprintf("dhtkv: data directory %s is in use by another dhtkv process\n", dir), errb.String())
	testcluster.WaitReady(t, p.base, time.Second)
}

// A DHTKV_* variable no flag has is named at start-up: once, at warn
// level, by a node that starts; in its one line by one that does not
// (the misspelling may be why).
func TestUnknownEnvironmentWarning(t *testing.T) {
	t.Setenv("DHTKV_LISTN", "127.0.0.1:1")
	var out, errb bytes.Buffer
	code := run([]string{"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:1"}, &out, &errb)
	assert.Equal(t, 1, code)
	assert.Contains(t, errb.String(), "bad node URL")
	assert.Contains(t, errb.String(), "; the environment has variables no flag reads, misspelt perhaps: DHTKV_LISTN (dhtkv -h lists them)",
		"said apart from the error, not as if the error's subject were ignored")
	assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "one line: %q", errb.String())

	// Under --log-format json the line is a record like the others.
	errb.Reset()
	code = run([]string{"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:1", "--log-format", "json"}, &out, &errb)
	assert.Equal(t, 1, code)
	var rec struct{ Level, Msg string }
	require.NoError(t, json.Unmarshal(errb.Bytes(), &rec), "one JSON record: %q", errb.String())
	assert.Equal(t, "ERROR", rec.Level)
	assert.Contains(t, rec.Msg, "bad node URL")
	assert.Contains(t, rec.Msg, "DHTKV_LISTN")

	if testing.Short() {
		t.Skip("runs the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	logPath := filepath.Join(t.TempDir(), "stderr")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	port := testcluster.FreePorts(t, 1)[0]
	cmd := exec.Command(bin, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", t.TempDir())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DHTKV_LISTN=127.0.0.1:1", "DHTKV_ENDPOINTS=127.0.0.1:8080", "DHTKV_LOG_LEVEL=info"}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	testcluster.WaitReady(t, fmt.Sprintf("http://127.0.0.1:%d", port), 15*time.Second)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait())
	logs, err := os.ReadFile(logPath)
	require.NoError(t, err)
	warned := regexp.MustCompile(`(?m)^.*level=WARN msg="environment variable ignored.*$`).FindAllString(string(logs), -1)
	require.Len(t, warned, 1, "%s", logs)
	assert.Contains(t, warned[0], "name=DHTKV_LISTN")
}

// A decommissioned node's data directory refuses to start with exit 0, as
// the decommission itself ends: a supervisor that restarts on failure
// (systemd, compose) does not restart it in a loop.
func TestDecommissionedExitsZero(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{MemTableBytes: 1 << 20})
	require.NoError(t, err)
	m, err := clustermap.Seed([]string{"http://127.0.0.1:30096"}, 1)
	require.NoError(t, err)
	require.NoError(t, st.SetClusterMap(m.Encode()))
	require.NoError(t, st.SetIdentity(store.Identity{Cluster: m.Cluster, Node: 7, Formed: true})) // not in m
	require.NoError(t, st.Close())

	var out, errb bytes.Buffer
	code := run([]string{"--listen", "127.0.0.1:0", "--self", "http://127.0.0.1:30096", "--data-dir", dir}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	require.Contains(t, errb.String(), "this node left the cluster: data directory "+dir+" belongs to node 7, which was decommissioned")
}

// What the node creates is its own, whatever the umask it was started
// with: directories 0700, files 0600 (the data directory holds every
// value; issue 23 found 0755 and 0644).
func TestDataFilesPrivate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	dir := filepath.Join(t.TempDir(), "node")
	p := startProc(t, bin, dir, testcluster.FreePorts(t, 1)[0])
	require.Equal(t, http.StatusCreated, testcluster.NewClient(t).Put(t, p.base, "k", []byte("v"), 1, 1))
	n := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		assert.Zero(t, info.Mode().Perm()&0o077, "%s is %v", path, info.Mode().Perm())
		n++
		return nil
	}))
	require.Greater(t, n, 3, "Pebble's files were looked at")
}
