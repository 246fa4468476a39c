package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// makeRun runs `make run` with vars from the Makefile of the repository,
// in dir (where ./data goes), without building: BIN must hold dhtkv.
func makeRun(t *testing.T, dir string, vars ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	args := append([]string{"-s", "-f", filepath.Join(testcluster.RepoRoot(t), "Makefile"), "-o", "build", "run"}, vars...)
	cmd := exec.Command("make", args...)
	cmd.Dir = dir
	// The test's own DHTKV_* variables and make flags stay out.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	return cmd
}

// TestMakeRunArgs: make run starts one node on PORT and ADMIN_PORT
// (8080 and PORT-2020 by default, as make run-cluster) with its data in
// DATA/single, never in a directory make run-cluster gives one of its
// nodes: a cluster node started alone would answer 504 to everything.
// A stand-in dhtkv records the arguments it is given.
func TestMakeRunArgs(t *testing.T) {
	bin := t.TempDir()
	argsFile := filepath.Join(bin, "args")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "dhtkv"),
		[]byte("#!/bin/sh\nprintf '%s\\n' \"$@\" >"+argsFile+"\n"), 0o755))
	for _, tc := range []struct {
		name                string
		vars                []string
		listen, admin, data string // data: relative to make's directory
		clusterData         string // the DATA make run-cluster uses with vars
	}{
		{"defaults", nil, "127.0.0.1:8080", "127.0.0.1:6060", "data/single", "data"},
		{"PORT", []string{"PORT=23080"}, "127.0.0.1:23080", "127.0.0.1:21060", "data/23080/single", "data/23080"},
		{"PORT and ADMIN_PORT", []string{"PORT=23080", "ADMIN_PORT=30000"}, "127.0.0.1:23080", "127.0.0.1:30000", "data/23080/single", "data/23080"},
		{"DATA", []string{"DATA=elsewhere"}, "127.0.0.1:8080", "127.0.0.1:6060", "elsewhere/single", "elsewhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_ = os.Remove(argsFile)
			out, err := makeRun(t, dir, append([]string{"BIN=" + bin}, tc.vars...)...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			b, err := os.ReadFile(argsFile)
			require.NoError(t, err, "make run did not start dhtkv: %s", out)
			args := map[string]string{}
			fields := strings.Fields(string(b))
			for i := 0; i+1 < len(fields); i += 2 {
				args[fields[i]] = fields[i+1]
			}
			assert.Equal(t, tc.listen, args["--listen"], "%s", b)
			assert.Equal(t, tc.admin, args["--admin-listen"], "%s", b)
			data := args["--data-dir"]
			if !filepath.IsAbs(data) {
				data = filepath.Join(dir, data)
			}
			assert.Equal(t, filepath.Join(dir, tc.data), filepath.Clean(data), "%s", b)
			for i := 1; i <= 3; i++ {
				assert.NotEqual(t, filepath.Join(dir, tc.clusterData, fmt.Sprintf("node%d", i)), filepath.Clean(data),
					"make run must not open make run-cluster's node%d", i)
			}
		})
	}
}

// TestMakeRun: the node make run starts answers on the ports it was
// given, as a cluster of one, keeps its data in DATA/single, and stops
// cleanly on SIGTERM.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make run: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	base := freeBase(t)
	dir := t.TempDir()
	cmd := makeRun(t, dir, "BIN="+filepath.Dir(bin), "PORT="+strconv.Itoa(base))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // make and the node it starts
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", base)
	admin := fmt.Sprintf("http://127.0.0.1:%d", base-2020)
	require.Eventually(t, func() bool {
		resp, err := http.Get(admin + "/livez")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "make run: %s", &out)
	c, err := client.New(client.Config{Endpoints: []string{url}})
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status(t.Context(), url)
	require.NoError(t, err)
	assert.Equal(t, url, st.Node)
	assert.Len(t, st.Members, 1, "a cluster of one")
	assert.DirExists(t, filepath.Join(dir, "data", strconv.Itoa(base), "single"))

	// As Ctrl-C does, to make and the node: the node stops cleanly (make
	// itself dies of the signal).
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM))
	select {
	case <-exited:
		stopped = true
		assert.Contains(t, out.String(), `msg="dhtkv node stopped"`)
	case <-time.After(30 * time.Second):
		t.Fatalf("make run still running 30 s after SIGTERM: %s", &out)
	}
}
