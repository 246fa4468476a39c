package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// The binary's level is changeable on its admin port: started at
// --log-level warn with every request in the access log, it logs no
// request until PUT /log-level?level=info, then one JSON line per
// request; --log-level is where it starts.
func TestRunTimeLogLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	ports := testcluster.FreePorts(t, 2)
	base, admin := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	log := startLogged(t, exec.Command(bin, "--listen", base[len("http://"):], "--admin-listen", admin[len("http://"):],
		"--data-dir", t.TempDir(), "--log-format", "json", "--log-level", "warn", "--access-log-sample", "1"))
	testcluster.WaitReady(t, base, 15*time.Second)
	accessLines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "access" {
				out = append(out, rec)
			}
		}
		return out
	}
	get := func(u string) {
		resp, err := http.Get(u)
		require.NoError(t, err)
		resp.Body.Close()
	}
	get(base + "/v0/entity?id=before")
	get(admin + "/log-level")
	req, err := http.NewRequest(http.MethodPut, admin+"/log-level?level=info", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	get(base + "/v0/entity?id=after")
	testcluster.Eventually(t, 5*time.Second, "the access line", func() bool { return len(accessLines()) > 0 })
	lines := accessLines()
	require.Len(t, lines, 1, "only the request after the change: %s", log)
	assert.Equal(t, "after", lines[0]["key"])
	assert.Equal(t, 404.0, lines[0]["status"])
	assert.Contains(t, log.String(), `"msg":"log level changed","from":"warn","to":"info"`)
}
