package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// mountSmallFS mounts a tmpfs of size bytes at a new directory for the
// test, and unmounts it at the end; it skips the test, saying why, where
// mounting is not permitted (not root, or no CAP_SYS_ADMIN in a
// container).
func mountSmallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a %s tmpfs to fill (needs root and CAP_SYS_ADMIN): %v: %s", size, err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// The experiment, on a real file system that fills: a node whose
// data directory is on a 48 MiB tmpfs, written with incompressible values
// until it refuses. It must refuse with 507 and a one-line reason, before
// Pebble meets ENOSPC, and never exit; read back every write it
// acknowledged; stay ready; say so in its status and metrics; and take
// writes again, the same process, once space is freed. (Before, it
// acknowledged writes until Pebble met ENOSPC on the WAL, panicked with
// "pebble: fatal commit error" and exited.)
//
// The node runs without L0 compactions: with incompressible values and
// no overwrites a compaction frees nothing, and its output, transiently
// the size of its input, is a large share of so small a volume, which
// would move the free space across the thresholds under the test. On a
// real volume the default threshold, 5%, leaves room for it.
func TestFullDiskRefusesWritesAndResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a file system under the binary: a process test; runs without -short")
	}
	fs := mountSmallFS(t, "48m")
	// Another user of the volume, which the operator removes later.
	filler := filepath.Join(fs, "filler")
	require.NoError(t, os.WriteFile(filler, make([]byte, 12<<20), 0o600))
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	ports := testcluster.FreePorts(t, 2)
	admin := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	p := startProc(t, bin, filepath.Join(fs, "data"), ports[0],
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--min-free-space", "8MiB", "--ballast-size", "2MiB", "--memtable-bytes", "1MiB", "--l0-compaction-threshold", "1000")
	pid := p.cmd.Process.Pid
	start := time.Now()
	cl := testcluster.NewClient(t)
	alive := func() {
		t.Helper()
		require.NoError(t, p.cmd.Process.Signal(syscall.Signal(0)), "the node exited")
	}

	acked := map[string][]byte{}
	var refused string
	for i := 0; refused == "" && i < 2000; i++ {
		k := fmt.Sprintf("k%04d", i)
		v := make([]byte, 256<<10)
		_, _ = rand.Read(v) // incompressible, as the values
		code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(p.base, k, 0, 0), v)
		switch code {
		case http.StatusCreated:
			acked[k] = v
		case http.StatusInsufficientStorage:
			refused = string(body)
		default:
			t.Fatalf("PUT %s: %d %s", k, code, body)
		}
	}
	require.NotEmpty(t, refused, "the disk never filled")
	t.Logf("%d writes acknowledged in %v, then: %s", len(acked), time.Since(start), strings.TrimSpace(refused))
	require.Equal(t, 1, strings.Count(refused, "\n"), "one line: %q", refused)
	require.Contains(t, refused, "insufficient storage: the data volume has ")
	require.Contains(t, refused, "below --min-free-space 8MiB (8.0 MiB): writes are refused until 10 MiB are free")
	require.Greater(t, len(acked), 40, "the node took writes until the threshold")
	alive()

	// Full, it refuses every write, and serves every acknowledged one.
	for range 5 {
		code, _ := cl.Do(t, http.MethodPut, testcluster.EntityURL(p.base, "more", 0, 0), []byte("v"))
		require.Equal(t, http.StatusInsufficientStorage, code)
		require.Equal(t, http.StatusInsufficientStorage, cl.Delete(t, p.base, "k0000", 0, 0))
	}
	for k, v := range acked {
		code, body := cl.Get(t, p.base, k, 0, 0)
		require.Equal(t, http.StatusOK, code, k)
		require.True(t, bytes.Equal(v, body), k)
	}
	code, body := cl.Do(t, http.MethodGet, p.base+"/v0/entities?start=%00&limit=5", nil)
	require.Equal(t, http.StatusOK, code, "scans go on: %s", body)
	code, _ = cl.Do(t, http.MethodGet, admin+"/readyz", nil)
	require.Equal(t, http.StatusOK, code, "a full node stays ready: it serves reads")
	code, body = cl.Do(t, http.MethodGet, p.base+"/v0/status", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), "warning: disk full: insufficient storage")
	require.Contains(t, string(body), "deleting the emergency ballast "+filepath.Join(fs, "data", store.BallastFile)+" frees 2.0 MiB at once")
	var st client.Status
	code, body = cl.Do(t, http.MethodGet, p.base+"/v0/status?verbose", nil)
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, json.Unmarshal(body, &st))
	require.True(t, st.Disk.Full)
	require.Equal(t, uint64(2<<20), st.Disk.BallastBytes)
	require.Less(t, st.Disk.FreeBytes, uint64(8<<20))
	code, body = cl.Do(t, http.MethodGet, admin+"/metrics", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), "\ndhtkv_disk_full 1\n")
	require.Contains(t, string(body), `dhtkv_store_writes_refused_total{reason="disk_full"}`)
	require.Contains(t, string(body), "\ndhtkv_store_failed 0\n")
	alive()

	// The operator frees space: writes resume, the same process.
	require.NoError(t, os.Remove(filler))
	require.Eventually(t, func() bool {
		code, _ := cl.Do(t, http.MethodPut, testcluster.EntityURL(p.base, "after", 0, 0), []byte("back"))
		return code == http.StatusCreated
	}, 10*time.Second, 50*time.Millisecond, "writes resume once space is freed")
	require.Equal(t, pid, p.cmd.Process.Pid)
	alive()
	code, body = cl.Get(t, p.base, "after", 0, 0)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "back", string(body))
	code, body = cl.Do(t, http.MethodGet, p.base+"/v0/status", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "OK\n", string(body))
	for k, v := range acked {
		code, body := cl.Get(t, p.base, k, 0, 0)
		require.Equal(t, http.StatusOK, code, k)
		require.True(t, bytes.Equal(v, body), k)
	}

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.cmd.Wait(), "SIGTERM exits 0; log:\n%s", p.log)
	log := p.log.String()
	require.NotContains(t, log, "panic")
	require.NotContains(t, log, "ENOSPC", "the guard stopped writes before Pebble ran out of space")
	require.Contains(t, log, "disk full: writes refused")
	require.Contains(t, log, "disk space back: writes resume")
}
