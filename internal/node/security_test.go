package node

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

func TestLoopbackHostPort(t *testing.T) {
	for hp, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.3.4.5:1": true, "[::1]:8080": true, "localhost:8080": true,
		"0.0.0.0:8080": false, ":8080": false, "10.0.0.1:8080": false, "[::]:8080": false,
		"example.com:80": false, "127.0.0.1": false, "": false,
	} {
		require.Equal(t, want, loopbackHostPort(hp), hp)
	}
}

// TestCheckExposure: without a secret, a listener or a member off loopback
// is refused; with one, any address is served.
func TestCheckExposure(t *testing.T) {
	for _, tc := range []struct {
		name, listen, secret, peerCA string
		members                      []string
		err                          string
	}{
		{"local", "127.0.0.1:8080", "", "", []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081"}, ""},
		{"all interfaces", ":8080", "", "", []string{"http://127.0.0.1:8080"}, "refusing to listen on :8080"},
		{"remote member", "127.0.0.1:8080", "", "", []string{"http://127.0.0.1:8080", "http://10.1.2.3:8080"}, "refusing cluster member http://10.1.2.3:8080"},
		{"remote with a secret", "0.0.0.0:8080", "s3cret", "", []string{"http://10.1.2.3:8080"}, ""},
		{"remote with mutual TLS", "0.0.0.0:8080", "", "ca.pem", []string{"http://10.1.2.3:8080"}, ""},
	} {
		err := checkExposure(Config{Listen: tc.listen, ClusterSecret: tc.secret, PeerTLSCA: tc.peerCA}, tc.members)
		if tc.err == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.err, tc.name)
			require.ErrorContains(t, err, "--cluster-secret-file or --peer-tls-ca", tc.name)
		}
	}
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	cfg := Config{ClusterSecretFile: write("ok", "s3cret\n", 0o600)}
	w, err := loadSecret(&cfg)
	require.NoError(t, err)
	require.Empty(t, w)
	require.Equal(t, "s3cret", cfg.ClusterSecret)

	cfg = Config{ClusterSecretFile: write("open", "s3cret", 0o644)}
	w, err = loadSecret(&cfg)
	require.NoError(t, err)
	require.Contains(t, w, "readable by other users")

	for name, c := range map[string]Config{
		"empty":      {ClusterSecretFile: write("empty", "\n", 0o600)},
		"two lines":  {ClusterSecretFile: write("two", "a\nb\n", 0o600)},
		"both given": {ClusterSecretFile: write("both", "a", 0o600), ClusterSecret: "b"},
		"missing":    {ClusterSecretFile: filepath.Join(dir, "nope")},
	} {
		_, err := loadSecret(&c)
		require.Error(t, err, name)
	}
}

// TestCheckClientExposure: without client tokens, a public or admin
// listener off loopback is refused, whatever authenticates the nodes;
// with them, any address is served.
func TestCheckClientExposure(t *testing.T) {
	for _, tc := range []struct {
		name, listen, admin, tokens string
		err                         string
	}{
		{"local", "127.0.0.1:8080", "127.0.0.1:6060", "", ""},
		{"local, no admin listener", "[::1]:8080", "", "", ""},
		{"public port on all interfaces", ":8080", "127.0.0.1:6060", "", "refusing to listen on :8080: without --client-tokens"},
		{"public port on an address", "10.0.0.1:8080", "", "", "refusing to listen on 10.0.0.1:8080: without --client-tokens"},
		{"admin port on all interfaces", "127.0.0.1:8080", "0.0.0.0:6060", "", "refusing the admin listener on 0.0.0.0:6060: without --client-tokens"},
		{"both, with tokens", "0.0.0.0:8080", "0.0.0.0:6060", "tokens", ""},
	} {
		err := checkClientExposure(Config{Listen: tc.listen, AdminListen: tc.admin, ClientTokens: tc.tokens})
		if tc.err == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.err, tc.name)
			require.ErrorContains(t, err, "so it must be a loopback address (docs/security.md)", tc.name)
		}
	}
}

// clientTokens writes a client token file and returns its path.
func clientTokens(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("admin admin-token-0123456789\n"), 0o600))
	return p
}

// TestNewRefusesExposedNodeWithoutTokens: node.New applies the clients'
// rule after the nodes' one: node authentication alone does not lift it,
// a token file does; one that does not load, or is readable by others,
// is said so.
func TestNewRefusesExposedNodeWithoutTokens(t *testing.T) {
	var logs strings.Builder
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "d")
	cfg.Listen = "0.0.0.0:0"
	cfg.ClusterSecret = "s3cret"
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	_, err := New(cfg)
	require.ErrorContains(t, err, "refusing to listen on 0.0.0.0:0: without --client-tokens")

	cfg.ClientTokens = filepath.Join(t.TempDir(), "absent")
	_, err = New(cfg)
	require.ErrorContains(t, err, "--client-tokens: client tokens: open "+cfg.ClientTokens)

	cfg.ClientTokens = clientTokens(t)
	require.NoError(t, os.WriteFile(cfg.ClientTokens, []byte("admin admin-token-0123456789\nadmin admin-token-0123456789\n"), 0o600))
	_, err = New(cfg)
	require.EqualError(t, err, "--client-tokens: "+cfg.ClientTokens+":2: the token of line 1 again: a token appears once, with one role")

	cfg.ClientTokens = clientTokens(t)
	require.NoError(t, os.Chmod(cfg.ClientTokens, 0o644))
	n, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	require.Contains(t, logs.String(), "is readable by other users (mode -rw-r--r--): chmod 600 it")
}

// TestNewRefusesExposedNodeWithoutSecret: node.New itself applies the
// rule, and a secret file lifts it.
func TestNewRefusesExposedNodeWithoutSecret(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "d")
	cfg.Listen = "0.0.0.0:0"
	cfg.ClientTokens = clientTokens(t)
	_, err := New(cfg)
	require.ErrorContains(t, err, "refusing to listen on 0.0.0.0:0")

	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("s3cret\n"), 0o600))
	cfg.ClusterSecretFile = secret
	n, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Close())
}

// TestNewServesExposedNodeWithMutualTLS: mutual TLS lifts the
// loopback-only rule as a secret does; TLS without --peer-tls-ca does not.
func TestNewServesExposedNodeWithMutualTLS(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "d")
	cfg.Listen = "0.0.0.0:0"
	cfg.ClientTokens = clientTokens(t)
	cfg.TLSCert, cfg.TLSKey, _ = ca.Issue("node")
	_, err := New(cfg)
	require.ErrorContains(t, err, "refusing to listen on 0.0.0.0:0", "TLS without --peer-tls-ca authenticates no node")
	cfg.PeerTLSCA = ca.File
	n, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Close())
}

// TestLoadTLSFlags: the TLS flags' combinations a node refuses to start
// with, each with the reason.
func TestLoadTLSFlags(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	cert, key, _ := ca.Issue("node")
	require.NoError(t, os.Chmod(key, 0o640))
	for _, tc := range []struct {
		name, cert, key, ca, err string
	}{
		{"no key", cert, "", "", "--tls-cert and --tls-key: give both"},
		{"no certificate", "", key, "", "--tls-cert and --tls-key: give both"},
		{"CA alone", "", "", ca.File, "--peer-tls-ca needs --tls-cert and --tls-key"},
		{"CA and key", "", key, ca.File, "--peer-tls-ca needs --tls-cert and --tls-key"},
		{"swapped", key, cert, "", "--tls-cert"},
	} {
		_, _, err := loadTLS(Config{TLSCert: tc.cert, TLSKey: tc.key, PeerTLSCA: tc.ca})
		require.ErrorContains(t, err, tc.err, tc.name)
	}
	certs, warning, err := loadTLS(Config{})
	require.NoError(t, err)
	require.Nil(t, certs, "no TLS")
	require.Empty(t, warning)
	certs, warning, err = loadTLS(Config{TLSCert: cert, TLSKey: key, PeerTLSCA: ca.File})
	require.NoError(t, err)
	require.True(t, certs.Mutual())
	require.Contains(t, warning, "--tls-key "+key+" is readable by other users (mode -rw-r-----)")
}

// TestInternalEndpointsLoopbackOnly: without a secret the internal
// endpoints answer 403 to a peer that is not on loopback, whatever it
// sends; from loopback they serve. Under mutual TLS a request without a
// verified client certificate gets 403 from loopback too.
func TestInternalEndpointsLoopbackOnly(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(t.TempDir(), "d")
	cfg.Listen = "127.0.0.1:0"
	n, err := New(cfg)
	require.NoError(t, err)
	defer n.Close()
	ca := testpki.NewCA(t, "cluster")
	cfg.DataDir = filepath.Join(t.TempDir(), "m")
	cfg.TLSCert, cfg.TLSKey, _ = ca.Issue("node")
	cfg.PeerTLSCA = ca.File
	mutual, err := New(cfg)
	require.NoError(t, err)
	defer mutual.Close()
	for _, tc := range []struct {
		ip   string
		want int
	}{{"10.0.0.9", 403}, {"192.168.1.1", 403}, {"127.0.0.1", 200}, {"::1", 200}} {
		for _, path := range []string{rpc.BatchPath, rpc.SummaryPath} {
			var req fasthttp.Request
			req.SetRequestURI(path)
			req.Header.SetMethod(fasthttp.MethodPost)
			if path == rpc.SummaryPath {
				req.SetBodyString("p")
			}
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 5000}, nil)
			n.Handler()(&ctx)
			require.Equal(t, tc.want, ctx.Response.StatusCode(), "%s from %s: %s", path, tc.ip, ctx.Response.Body())

			var mctx fasthttp.RequestCtx
			mctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 5000}, nil)
			mutual.Handler()(&mctx)
			require.Equal(t, 403, mctx.Response.StatusCode(), "mutual TLS: %s from %s", path, tc.ip)
			require.Equal(t, "forbidden: the internal endpoints require a client certificate from --peer-tls-ca\n", string(mctx.Response.Body()))
		}
	}
}
