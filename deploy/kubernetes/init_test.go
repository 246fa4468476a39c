// Package kubernetes holds the Kubernetes manifests of dhtkv (a
// kustomization: docs/kubernetes.md) and the test of their init script
// against real nodes and the real dhtkvctl. The manifests themselves are
// rendered and checked by validate/, a module of its own so that this
// module does not depend on the Kubernetes API packages.
package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// ctlDir builds cmd/dhtkvctl once into a directory put first on the
// script's PATH.
func ctlDir(t *testing.T) string {
	t.Helper()
	ctlOnce.Do(func() {
		ctlPath, ctlErr = os.MkdirTemp("", "dhtkvctl-bin-")
		if ctlErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-C", "../..", "-o", filepath.Join(ctlPath, "dhtkvctl"), "./cmd/dhtkvctl").CombinedOutput()
		if err != nil {
			ctlErr = fmt.Errorf("go build ./cmd/dhtkvctl: %v\n%s", err, out)
		}
	})
	require.NoError(t, ctlErr)
	return ctlPath
}

var (
	ctlOnce sync.Once
	ctlPath string
	ctlErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if ctlPath != "" {
		os.RemoveAll(ctlPath)
	}
	os.Exit(code)
}

// shells are the shells the script is run with: sh, and busybox's (the
// init image's) where it is installed; the last is the image's where
// there is a choice.
func shells() [][]string {
	out := [][]string{{"sh"}}
	if _, err := exec.LookPath("busybox"); err == nil {
		out = append(out, []string{"busybox", "sh"})
	}
	return out
}

// pod is the environment of one pod's init container, as
// statefulset.yaml sets it, with loopback URLs.
type pod struct {
	name, self, seeds, driverURL, driverAdmin string
	dataDir, secretsDir, runDir               string
}

// newPod returns pod name's environment: secrets in a directory of their
// own, an empty run directory, dataDir as given.
func newPod(t *testing.T, name, self, seeds, driverURL, driverAdmin, dataDir string) pod {
	t.Helper()
	secrets := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(secrets, "cluster-secret"), []byte("s3cret-of-the-cluster\n"), 0o440))
	require.NoError(t, os.WriteFile(filepath.Join(secrets, "client-tokens"), []byte("admin abcdefghijklmnopqrstuvwx\n"), 0o440))
	return pod{name: name, self: self, seeds: seeds, driverURL: driverURL, driverAdmin: driverAdmin,
		dataDir: dataDir, secretsDir: secrets, runDir: t.TempDir()}
}

// run runs init.sh for p with shell until it exits or timeout passes
// (then it is killed: timedOut). The nodes of these tests take no token.
func (p pod) run(t *testing.T, shell []string, timeout time.Duration) (code int, stderr string, timedOut bool) {
	t.Helper()
	env := []string{"PATH=" + ctlDir(t) + string(os.PathListSeparator) + os.Getenv("PATH"), "RETRY=0.2"}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell[0], append(shell[1:], "init.sh")...)
	for k, v := range map[string]string{"POD_NAME": p.name, "SELF_URL": p.self, "SEED_URLS": p.seeds,
		"DRIVER_URL": p.driverURL, "DRIVER_ADMIN": p.driverAdmin, "DATA_DIR": p.dataDir,
		"SECRETS_DIR": p.secretsDir, "RUN_DIR": p.runDir} {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	cmd.Env = env
	var errb bytes.Buffer
	cmd.Stderr, cmd.Stdout = &errb, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		return -1, errb.String(), true
	}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "init.sh: %v", err)
		return ee.ExitCode(), errb.String(), false
	}
	return 0, errb.String(), false
}

// conf is the node.conf the script wrote ("" if none).
func (p pod) conf(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.runDir, "node.conf"))
	if os.IsNotExist(err) {
		return ""
	}
	require.NoError(t, err)
	return string(b)
}

// TestInitScript: what init.sh writes and refuses without a cluster to
// ask: seeds get --cluster and never contact anyone, a pod that is not a
// seed gets --join and asks for nothing when its volume has data, keeps
// asking (and never reports success) while the driver does not answer,
// and a pod whose name, URL or environment contradicts the seed list is
// refused with the reason. The secrets are copied readable by their
// owner only.
func TestInitScript(t *testing.T) {
	seeds := "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3"
	dead := testcluster.DeadEndpoint(t) // nothing listens: a contact would fail
	withData := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(withData, "MANIFEST-000001"), []byte("x"), 0o600))
	for _, sh := range shells() {
		for _, tc := range []struct {
			name         string
			pod          string
			self         string
			dataDir      string
			drop         string // a variable left unset, or a secret file removed
			code         int    // -1: still running at the deadline
			conf, errHas string
		}{
			{name: "seed 0", pod: "dhtkv-0", self: "http://127.0.0.1:1", conf: "cluster " + seeds + "\n", errHas: "seed 0 of 3"},
			{name: "seed 2", pod: "dhtkv-2", self: "http://127.0.0.1:3", conf: "cluster " + seeds + "\n"},
			{name: "seed of another URL", pod: "dhtkv-1", self: "http://127.0.0.1:9", code: 2, errHas: "seed 1 of SEED_URLS is http://127.0.0.1:2, not SELF_URL"},
			{name: "a seed's URL on another ordinal", pod: "dhtkv-4", self: "http://127.0.0.1:2", code: 2, errHas: "is seed 1 of SEED_URLS, but this pod's ordinal is 4"},
			{name: "no ordinal", pod: "dhtkv", self: "http://127.0.0.1:1", code: 2, errHas: "does not end in -ORDINAL"},
			{name: "no SEED_URLS", pod: "dhtkv-0", self: "http://127.0.0.1:1", drop: "SEED_URLS", code: 2, errHas: "SEED_URLS is not set"},
			{name: "a secret file missing", pod: "dhtkv-0", self: "http://127.0.0.1:1", drop: "client-tokens", code: 1, errHas: "client-tokens"},
			{name: "joiner with data", pod: "dhtkv-3", self: "http://127.0.0.1:4", dataDir: withData, conf: "join http://" + dead + "\n", errHas: "holds data: the node starts on its stored map"},
			{name: "joiner, driver down", pod: "dhtkv-3", self: "http://127.0.0.1:4", code: -1, conf: "join http://" + dead + "\n", errHas: "not joined yet; trying again"},
		} {
			t.Run(strings.Join(sh, " ")+"/"+tc.name, func(t *testing.T) {
				dataDir := tc.dataDir
				if dataDir == "" {
					dataDir = filepath.Join(t.TempDir(), "data") // absent until the node starts
				}
				p := newPod(t, tc.pod, tc.self, seeds, "http://"+dead, dead, dataDir)
				switch tc.drop {
				case "SEED_URLS":
					p.seeds = ""
				case "client-tokens":
					require.NoError(t, os.Remove(filepath.Join(p.secretsDir, "client-tokens")))
				}
				code, stderr, timedOut := p.run(t, sh, 2*time.Second)
				if tc.code == -1 {
					assert.True(t, timedOut, "init.sh exited (%d) although the driver never answered: %s", code, stderr)
				} else {
					require.False(t, timedOut, "init.sh did not exit: %s", stderr)
					assert.Equal(t, tc.code, code, stderr)
				}
				assert.Contains(t, stderr, tc.errHas)
				assert.Equal(t, tc.conf, p.conf(t))
				if tc.code != 0 || tc.drop != "" {
					return
				}
				for _, f := range []string{"cluster-secret", "client-tokens"} {
					want, err := os.ReadFile(filepath.Join(p.secretsDir, f))
					require.NoError(t, err)
					got, err := os.ReadFile(filepath.Join(p.runDir, f))
					require.NoError(t, err)
					assert.Equal(t, want, got, f)
					info, err := os.Stat(filepath.Join(p.runDir, f))
					require.NoError(t, err)
					assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "%s: the node warns about a file others may read", f)
				}
			})
		}
	}
}

// TestInitScriptScales runs init.sh as the StatefulSet would against a
// real 3-node cluster: two pods added at once (Parallel pod management)
// both join, one change after the other through the one driver, with
// distinct ids; a pod that restarts on its volume asks for nothing; a
// decommissioned pod's volume is not joined again; a pod that lost its
// volume (ordinal 3, then seed 1) starts under the same identity without
// a membership change and rebuilds its share, and every write stays
// readable from all three replicas.
func TestInitScriptScales(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of real nodes: runs without -short")
	}
	sh := shells()[len(shells())-1]
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	const keys = 100
	for i := range keys {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), fmt.Sprintf("k%d", i), []byte(fmt.Sprintf("v%d", i)), 2, 3))
	}
	seeds := strings.Join([]string{c.URL(0), c.URL(1), c.URL(2)}, ",")
	admin := c.Node(0).AdminAddr()
	epoch := func() uint64 {
		m, _ := c.Node(0).Members().Map()
		return m.Epoch
	}
	podOf := func(ordinal, i int) pod {
		return newPod(t, fmt.Sprintf("dhtkv-%d", ordinal), c.URL(i), seeds, c.URL(0), admin, c.Config(i).DataDir)
	}

	// Scale 3 → 5: both init containers start at once.
	joiners := []int{c.AddNode(t, 0), c.AddNode(t, 0)}
	pods := []pod{podOf(3, joiners[0]), podOf(4, joiners[1])}
	type done struct {
		k        int
		code     int
		stderr   string
		timedOut bool
	}
	finished := make(chan done, len(pods))
	for k := range pods {
		go func() {
			code, stderr, timedOut := pods[k].run(t, sh, 2*time.Minute)
			finished <- done{k, code, stderr, timedOut}
		}()
	}
	for range pods {
		d := <-finished
		require.False(t, d.timedOut, "init.sh for %s did not finish: %s", pods[d.k].name, d.stderr)
		require.Equal(t, 0, d.code, "init.sh for %s: %s", pods[d.k].name, d.stderr)
		assert.Equal(t, "join "+c.URL(0)+"\n", pods[d.k].conf(t))
		// The node's container starts once its init container is done;
		// the other pod's join waits for this one's change to end.
		c.StartNode(joiners[d.k])
	}
	m := c.AwaitStable(t, 2*time.Minute)
	require.Len(t, m.Nodes, 5, "%s", m)
	ids := map[int]string{}
	for _, n := range m.Nodes {
		require.NotContains(t, ids, n.ID, "node id %d twice: %s", n.ID, m)
		ids[n.ID] = n.URL
	}

	// A pod that restarts on its volume asks for nothing.
	before := epoch()
	code, stderr, _ := pods[0].run(t, sh, time.Minute)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "holds data")
	assert.Equal(t, before, epoch())

	// Scale-down: decommission dhtkv-4; its volume, kept, is not joined
	// again (the node itself then refuses it: this node left the cluster).
	c.Decommission(t, 0, joiners[1])
	c.AwaitLeft(t, joiners[1], 2*time.Minute)
	m = c.AwaitStable(t, 2*time.Minute)
	require.Len(t, m.Nodes, 4, "%s", m)
	before = epoch()
	code, stderr, _ = pods[1].run(t, sh, time.Minute)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "holds data")
	assert.Equal(t, before, epoch(), "no change asked for a node that left")

	// dhtkv-3 loses its volume: a new, empty claim under the same name.
	lost := joiners[0]
	c.StopNode(lost)
	c.WipeNode(lost)
	p := podOf(3, lost)
	code, stderr, _ = p.run(t, sh, time.Minute)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "is in the cluster map")
	assert.Equal(t, before, epoch(), "the same identity: no membership change")
	c.StartNode(lost)
	testcluster.Eventually(t, 2*time.Minute, "dhtkv-3 rebuilt", func() bool { return !c.Node(lost).Rebuilding() })

	// Seed dhtkv-1 loses its volume: it seeds the list's map again and
	// rebuilds; the others hand it the current map.
	c.StopNode(1)
	c.WipeNode(1)
	p = podOf(1, 1)
	code, stderr, _ = p.run(t, sh, time.Minute)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "cluster "+seeds+"\n", p.conf(t))
	c.StartNode(1)
	testcluster.Eventually(t, 2*time.Minute, "dhtkv-1 rebuilt on the current map", func() bool {
		mine, _ := c.Node(1).Members().Map()
		return !c.Node(1).Rebuilding() && mine.Epoch == epoch()
	})
	c.AwaitReady(time.Minute)
	for i := range keys {
		code, body := cl.Get(t, c.URL(1), fmt.Sprintf("k%d", i), 3, 3)
		require.Equal(t, http.StatusOK, code, "k%d", i)
		require.Equal(t, fmt.Sprintf("v%d", i), string(body))
	}
}
