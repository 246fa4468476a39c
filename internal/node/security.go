package node

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
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
