package main

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestSIGHUPReloadsClientTokens: a running dhtkv process with
// --client-tokens takes a changed token file on SIGHUP, without a restart
// (a token added is let in, one removed is refused); after a SIGHUP with a
// bad file it logs why and keeps the tokens in use; SIGTERM still stops
// it cleanly.
func TestSIGHUPReloadsClientTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("signals the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	tok := testcluster.NewTokens(t)
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--sync=false", "--client-tokens", tok.File)
	log := startLogged(t, cmd)
	addr := testcluster.LoggedListen(t, log.String, 30*time.Second)
	require.Contains(t, log.String(), "client_tokens=true")
	get := func(token string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/v0/entity?id=k", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return get(tok.Read) == http.StatusNotFound }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, http.StatusUnauthorized, get(""))

	const added = "rotated-read-token-0123456789"
	require.NoError(t, os.WriteFile(tok.File, []byte("read "+added+"\nadmin "+tok.Admin+"\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return get(added) == http.StatusNotFound }, 10*time.Second, 10*time.Millisecond,
		"the added token is let in after SIGHUP")
	require.Equal(t, http.StatusUnauthorized, get(tok.Read), "the removed token is refused")
	require.Contains(t, log.String(), "client tokens reloaded")

	require.NoError(t, os.WriteFile(tok.File, []byte("read "+tok.Read+"\nroot "+tok.Write+"\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), `level=ERROR msg="client token reload failed; the tokens in use stay"`)
	}, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, log.String(), tok.File+`:2: unknown role \"root\"`)
	require.Equal(t, http.StatusNotFound, get(added), "the tokens in use stay")
	require.Equal(t, http.StatusUnauthorized, get(tok.Read), "nothing of the bad file is taken")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit 0")
}

// TestExposedNodeNeedsClientTokens: dhtkv refuses to start on an address
// that is not loopback without --client-tokens, even with node-to-node
// authentication, and names the flag; a token file that does not load
// stops it with the file, the line and the reason.
func TestExposedNodeNeedsClientTokens(t *testing.T) {
	secret := t.TempDir() + "/secret"
	require.NoError(t, os.WriteFile(secret, []byte("s3cret-s3cret\n"), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{"public port", []string{"--listen", "0.0.0.0:0", "--cluster-secret-file", secret},
			"dhtkv: refusing to listen on 0.0.0.0:0: without --client-tokens, whoever reaches it may read, write and delete every key"},
		{"admin port", []string{"--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"},
			"dhtkv: refusing the admin listener on 0.0.0.0:0: without --client-tokens"},
		// An address this machine does not have: refused for its exposure,
		// not failed by the bind (TEST-NET-1, never assigned).
		{"an address not here", []string{"--listen", "192.0.2.1:8080", "--cluster-secret-file", secret},
			"dhtkv: refusing to listen on 192.0.2.1:8080: without --client-tokens"},
		{"bad token file", []string{"--listen", "127.0.0.1:0", "--client-tokens", writeTemp(t, "read short\n")},
			":1: token of 5 characters: at least 16"},
	} {
		var out, errb bytes.Buffer
		code := run(append(tc.args, "--data-dir", t.TempDir()), &out, &errb)
		require.Equal(t, 1, code, tc.name)
		require.Contains(t, errb.String(), tc.err, tc.name)
		require.Equal(t, 1, strings.Count(errb.String(), "\n"), "%s: one line: %s", tc.name, errb.String())
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := t.TempDir() + "/tokens"
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}
