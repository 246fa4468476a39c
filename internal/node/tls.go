package node

import (
	"errors"
	"fmt"

	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// TLS on the public listener and between nodes (docs/security.md). The
// files are read by package tlsconf; this file checks the flags'
// combinations and reloads them.

// loadTLS reads cfg's TLS files: nil without --tls-cert, an error for a
// combination that cannot work or a file that does not pass tlsconf's
// checks, and a warning when the key is readable by other users.
func loadTLS(cfg Config) (_ *tlsconf.Certs, warning string, err error) {
	switch {
	case cfg.TLSCert == "" && cfg.TLSKey == "" && cfg.PeerTLSCA == "":
		return nil, "", nil
	case cfg.TLSCert == "" || cfg.TLSKey == "":
		if cfg.PeerTLSCA != "" {
			return nil, "", errors.New("--peer-tls-ca needs --tls-cert and --tls-key: a node presents its own certificate to the others")
		}
		return nil, "", errors.New("--tls-cert and --tls-key: give both")
	}
	certs, err := tlsconf.Load(tlsconf.Files{Cert: cfg.TLSCert, Key: cfg.TLSKey, PeerCA: cfg.PeerTLSCA})
	if err != nil {
		return nil, "", err
	}
	return certs, keyWarning(cfg.TLSKey), nil
}

// keyWarning is a warning when the key file is readable by other users.
func keyWarning(path string) string {
	if mode, open := readableByOthers(path); open {
		return fmt.Sprintf("--tls-key %s is readable by other users (mode %v): chmod 600 it", path, mode)
	}
	return ""
}

// tlsMode names how the public listener is served, for the start-up log.
func tlsMode(certs *tlsconf.Certs) string {
	switch {
	case certs == nil:
		return "off"
	case certs.Mutual():
		return "mutual"
	}
	return "on"
}

// reloadTLS reads the TLS files (--tls-cert, --tls-key, --peer-tls-ca)
// again and makes them the ones every new connection uses, accepted or
// made to another node; connections already open keep the certificates
// they were opened with. A reload that fails (a file missing or
// unreadable, a key that does not match its certificate, a certificate
// expired or not from --peer-tls-ca) changes nothing: the error is logged
// and returned. Without TLS it returns nil.
func (n *Node) reloadTLS() error {
	if n.certs == nil {
		return nil
	}
	if err := n.certs.Reload(); err != nil {
		n.log.Error("TLS reload failed; the certificates in use stay", "err", err)
		return fmt.Errorf("reload TLS files: %w", err)
	}
	leaf := n.certs.Leaf()
	n.log.Info("TLS certificates reloaded", "subject", leaf.Subject.String(),
		"serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter.UTC())
	if w := keyWarning(n.cfg.TLSKey); w != "" {
		n.log.Warn(w)
	}
	return nil
}
