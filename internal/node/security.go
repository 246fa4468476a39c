package node

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/dhtkv/dhtkv/internal/clientauth"
)

// Secure by default (docs/security.md): node-to-node requests can carry
// any version, so whoever reaches the internal endpoints can overwrite any
// key. Without authentication (a cluster secret, or mutual TLS:
// --peer-tls-ca) a node therefore serves only loopback: it refuses to
// start when its listener or any member of its cluster is not a loopback
// address, and its internal endpoints answer only loopback peers
// (httpapi). A local cluster, as make run-cluster and the tests start,
// needs no setup.

// loadSecret sets cfg.ClusterSecret from ClusterSecretFile, if given. The
// file holds the secret, one line; a trailing newline is dropped. A file
// others may read is accepted, with a warning in the returned string.
func loadSecret(cfg *Config) (warning string, err error) {
	if cfg.ClusterSecretFile == "" {
		if err := checkSecret(cfg.ClusterSecret); err != nil {
			return "", fmt.Errorf("--cluster-secret: %w", err)
		}
		return "", nil
	}
	if cfg.ClusterSecret != "" {
		return "", fmt.Errorf("--cluster-secret and --cluster-secret-file: give one")
	}
	b, err := os.ReadFile(cfg.ClusterSecretFile)
	if err != nil {
		return "", fmt.Errorf("--cluster-secret-file: %w", err)
	}
	secret := strings.TrimRight(string(b), "\r\n")
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		return "", fmt.Errorf("--cluster-secret-file %s: want one non-empty line", cfg.ClusterSecretFile)
	}
	if err := checkSecret(secret); err != nil {
		return "", fmt.Errorf("--cluster-secret-file %s: %w", cfg.ClusterSecretFile, err)
	}
	cfg.ClusterSecret = secret
	if mode, open := readableByOthers(cfg.ClusterSecretFile); open {
		warning = fmt.Sprintf("--cluster-secret-file %s is readable by other users (mode %v): chmod 600 it", cfg.ClusterSecretFile, mode)
	}
	return warning, nil
}

// readableByOthers reports whether a file's mode lets users other than
// its owner read it (group or others bits), and the mode. A file that
// cannot be stated is not reported: reading it fails with the reason.
func readableByOthers(path string) (os.FileMode, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	return info.Mode().Perm(), info.Mode().Perm()&0o077 != 0
}

// checkExposure refuses, without node-to-node authentication (a cluster
// secret or mutual TLS), a listener or a member that is not a loopback
// address.
func checkExposure(cfg Config, members []string) error {
	if cfg.ClusterSecret != "" || cfg.PeerTLSCA != "" {
		return nil
	}
	const why = "without --cluster-secret-file or --peer-tls-ca, nodes accept writes of any version from whoever reaches them, so every address must be loopback (docs/security.md)"
	if !loopbackHostPort(cfg.Listen) {
		return fmt.Errorf("refusing to listen on %s: %s", cfg.Listen, why)
	}
	for _, m := range members {
		u, err := url.Parse(m)
		if err != nil || !loopbackHostPort(u.Host) {
			return fmt.Errorf("refusing cluster member %s: %s", m, why)
		}
	}
	return nil
}

// Clients are held to the same rule (docs/security.md): without client
// tokens (--client-tokens) a node refuses to start when its public or admin
// listener is not on a loopback address, since whoever reaches them could
// read, write and delete every key, and change the cluster's membership.

// loadTokens reads cfg.ClientTokens, if given: nil without it. A file
// others may read is accepted, with a warning in the returned string.
func loadTokens(cfg Config) (_ *clientauth.Tokens, warning string, err error) {
	if cfg.ClientTokens == "" {
		return nil, "", nil
	}
	tokens, err := clientauth.Load(cfg.ClientTokens)
	if err != nil {
		return nil, "", fmt.Errorf("--client-tokens: %w", err)
	}
	return tokens, tokensWarning(cfg.ClientTokens), nil
}

// tokensWarning is a warning when the token file is readable by other
// users.
func tokensWarning(path string) string {
	if mode, open := readableByOthers(path); open {
		return fmt.Sprintf("--client-tokens %s is readable by other users (mode %v): chmod 600 it", path, mode)
	}
	return ""
}

// checkClientExposure refuses, without client tokens, a public or admin
// listener address (--listen, --admin-listen) that is not loopback. As for
// checkExposure, a listener a test hands over (Config.Listener,
// AdminListener) is judged by those addresses, its name.
func checkClientExposure(cfg Config) error {
	if cfg.ClientTokens != "" {
		return nil
	}
	const why = "without --client-tokens, whoever reaches it may read, write and delete every key (and, on the admin port, change the cluster's membership), so it must be a loopback address (docs/security.md)"
	if !loopbackHostPort(cfg.Listen) {
		return fmt.Errorf("refusing to listen on %s: %s", cfg.Listen, why)
	}
	if cfg.AdminListen != "" && !loopbackHostPort(cfg.AdminListen) {
		return fmt.Errorf("refusing the admin listener on %s: %s", cfg.AdminListen, why)
	}
	return nil
}

// Reload reads the client token file (--client-tokens) and the TLS files
// (--tls-cert, --tls-key, --peer-tls-ca) again, each of those the node
// was started with, and puts what it read in use: the tokens for every
// later request, the certificates for every new connection (connections
// already open keep the ones they were opened with). A file that fails to
// load changes nothing of its kind: the tokens, or the certificates, in
// use stay, and the error is logged and returned (both errors if both
// fail). Client authentication or TLS cannot be turned on or off by a
// reload: that takes a restart. cmd/dhtkv calls it on SIGHUP; it is safe
// to call at any time from any goroutine.
func (n *Node) Reload() error {
	if n.tokens == nil && n.certs == nil {
		n.log.Info("reload: no client tokens and no TLS files, nothing to reload")
		return nil
	}
	return errors.Join(n.reloadTokens(), n.reloadTLS())
}

// reloadTokens reads the client token file again (Reload), if there is
// one.
func (n *Node) reloadTokens() error {
	if n.tokens == nil {
		return nil
	}
	if err := n.tokens.Reload(); err != nil {
		n.log.Error("client token reload failed; the tokens in use stay", "err", err)
		return fmt.Errorf("reload client tokens: %w", err)
	}
	read, write, admin := n.tokens.Count()
	n.log.Info("client tokens reloaded", "file", n.tokens.Path(), "read", read, "write", write, "admin", admin)
	if w := tokensWarning(n.tokens.Path()); w != "" {
		n.log.Warn(w)
	}
	return nil
}

// loopbackHostPort reports whether host:port names a loopback address:
// localhost, or an IP in 127.0.0.0/8 or ::1. An empty host (all
// interfaces) is not.
func loopbackHostPort(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkSecret refuses a secret an HTTP header cannot carry as it is: one
// that begins or ends with a space or a tab (the receiving node's parser
// drops them from the value, so it would compare another secret and
// answer 403 to every node), or holds a control byte.
func checkSecret(secret string) error {
	if strings.TrimLeft(secret, " \t") != secret || strings.TrimRight(secret, " \t") != secret {
		return errors.New("the secret begins or ends with a space or a tab, which HTTP drops from a header: remove them")
	}
	for i := 0; i < len(secret); i++ {
		if c := secret[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("byte %d of the secret is the control byte 0x%02x, which a header cannot carry", i, c)
		}
	}
	return nil
}
