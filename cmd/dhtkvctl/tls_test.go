package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// dhtkvctl against a real 3-node cluster serving mutual TLS: with
// --cacert the endpoints are https, host:port included, and every command
// works; the admin listener stays plain HTTP; --cert and --key present a
// client certificate (one from another CA fails the handshake); without
// the flags, or with the wrong CA, the command fails, and the flags' misuse
// is a usage error.
func TestTLS(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	c := testcluster.Start(t, 3, testcluster.MutualTLS(ca))
	c.AwaitReady(10 * time.Second)
	var hostports []string
	for i := range 3 {
		hostports = append(hostports, c.Config(i).Listen)
	}
	eps := "--endpoints=" + strings.Join(hostports, ",")
	cacert := "--cacert=" + ca.File
	clientCert, clientKey, _ := ca.Issue("operator", x509.ExtKeyUsageClientAuth)
	other := testpki.NewCA(t, "other")
	otherCert, otherKey, _ := other.Issue("stranger", x509.ExtKeyUsageClientAuth)

	for _, s := range []step{
		{name: "put", args: []string{eps, cacert, "put", "k", "v"}, out: "OK\n"},
		{name: "get", args: []string{eps, cacert, "get", "k"}, out: "v"},
		{name: "https endpoint", args: []string{"--endpoints", c.Endpoint(1), cacert, "get", "k"}, out: "v"},
		{name: "scan", args: []string{eps, cacert, "scan", "--keys-only"}, out: "k\n"},
		{name: "flags after the command", args: []string{"del", eps, cacert, "k"}, out: "OK\n"},
		{name: "status", args: []string{eps, cacert, "status"}, check: func(t *testing.T, out string) {
			rows := table(out)
			require.Len(t, rows, 4, out)
			for i := range 3 {
				assert.Equal(t, []string{c.Endpoint(i), "yes"}, rows[i+1][:2], out)
			}
		}},
		{name: "client certificate", args: []string{eps, cacert, "--cert", clientCert, "--key", clientKey, "put", "k", "v2"}, out: "OK\n"},
		{name: "repair: the admin listener is plain HTTP", args: []string{cacert, "repair", "--admin", c.Node(0).AdminAddr()}, outHas: []string{"PEER"}},

		{name: "no --cacert: plain HTTP to a TLS node", args: []string{eps, "get", "k"}, code: exitBadRequest, errHas: "this port speaks TLS (use https://)"},
		{name: "https without --cacert: the system's roots", args: []string{"--endpoints", c.Endpoint(0), "get", "k"}, code: exitError, errHas: "certificate signed by unknown authority"},
		{name: "another CA", args: []string{eps, "--cacert", other.File, "get", "k"}, code: exitError, errHas: "certificate signed by unknown authority"},
		{name: "http:// with --cacert", args: []string{"--endpoints", c.URL(0), cacert, "get", "k"}, code: exitUsage, errHas: "is http:// but a TLS configuration is given"},
		{name: "--cert without --key", args: []string{eps, cacert, "--cert", clientCert, "get", "k"}, code: exitUsage, errHas: "--cert and --key go together"},
		{name: "--cacert missing", args: []string{eps, "--cacert", filepath.Join(t.TempDir(), "absent.pem"), "get", "k"}, code: exitError, errHas: "no such file"},
		{name: "--cacert not PEM", args: []string{eps, "--cacert", clientKey, "get", "k"}, code: exitError, errHas: "no PEM certificate"},
	} {
		s.run(t)
	}

	t.Setenv("DHTKV_CACERT", ca.File)
	step{name: "DHTKV_CACERT", args: []string{eps, "get", "k"}, out: "v2"}.run(t)
	t.Setenv("DHTKV_CACERT", "")

	// A node asks for a client certificate but takes a connection without
	// one, and Go's TLS client sends only a certificate from a CA the
	// server names. A server that requires one from ca shows that --cert
	// and --key present it, and that a certificate of another CA is not
	// taken.
	srvCert, srvKey, _ := ca.Issue("server")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello "+r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{testpki.KeyPair(t, srvCert, srvKey)},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool, MinVersion: tls.VersionTLS12,
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	defer srv.Close()
	ep := "--endpoints=" + srv.Listener.Addr().String()
	for _, s := range []step{
		{name: "certificate required: presented", args: []string{ep, cacert, "--cert", clientCert, "--key", clientKey, "get", "k"}, out: "hello operator"},
		{name: "certificate required: none", args: []string{ep, cacert, "get", "k"}, code: exitError, errHas: "certificate required"},
		{name: "certificate required: another CA's", args: []string{ep, cacert, "--cert", otherCert, "--key", otherKey, "get", "k"}, code: exitError, errHas: "certificate required"},
	} {
		s.run(t)
	}
}
