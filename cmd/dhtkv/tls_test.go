package main

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// TestSIGHUPReloadsCertificates: a running dhtkv process serves a renewed
// certificate (same CA, new serial) after SIGHUP, without a restart; after
// a SIGHUP with a broken key file it logs the error and keeps serving the
// renewed one; SIGTERM still stops it cleanly.
func TestSIGHUPReloadsCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("signals the binary: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	ca := testpki.NewCA(t, "cluster")
	certFile, keyFile, first := ca.Issue("node")
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--sync=false",
		"--tls-cert", certFile, "--tls-key", keyFile, "--peer-tls-ca", ca.File)
	log := startLogged(t, cmd)
	addr := testcluster.LoggedListen(t, log.String, 30*time.Second)
	require.Contains(t, log.String(), "tls=mutual")
	served := func() string {
		c, err := testpki.Served(addr, ca.ClientConfig())
		if err != nil {
			return err.Error()
		}
		return c.SerialNumber.String()
	}
	require.Equal(t, first.SerialNumber.String(), served())

	renewed := ca.IssueTo(certFile, keyFile, "node")
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return served() == renewed.SerialNumber.String() }, 10*time.Second, 10*time.Millisecond,
		"the renewed certificate is served after SIGHUP")
	require.Contains(t, log.String(), "TLS certificates reloaded")

	require.NoError(t, os.WriteFile(keyFile, []byte("not a key\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), `level=ERROR msg="TLS reload failed; the certificates in use stay"`)
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, renewed.SerialNumber.String(), served())

	cl := testcluster.NewTLSClient(t, ca.ClientConfig())
	defer cl.HTTP.CloseIdleConnections()
	code, _ := cl.Do(t, http.MethodGet, "https://"+addr+"/v0/status", nil)
	require.Equal(t, http.StatusOK, code)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit 0")
}
