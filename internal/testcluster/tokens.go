package testcluster

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
)

// Tokens is a client token file (--client-tokens) holding one fresh token
// of each role.
type Tokens struct {
	File               string
	Read, Write, Admin string
}

// NewTokens writes a token file, mode 600, in a temporary directory.
func NewTokens(t testing.TB) Tokens {
	t.Helper()
	tok := Tokens{File: filepath.Join(t.TempDir(), "client-tokens"),
		Read: "read-" + rand.Text(), Write: "write-" + rand.Text(), Admin: "admin-" + rand.Text()}
	content := "# testcluster.NewTokens\nread " + tok.Read + "\nwrite " + tok.Write + "\nadmin " + tok.Admin + "\n"
	require.NoError(t, os.WriteFile(tok.File, []byte(content), 0o600))
	return tok
}

// ClientTokens starts every node with --client-tokens tok.File.
func ClientTokens(tok Tokens) Option {
	return func(_ int, c *node.Config) { c.ClientTokens = tok.File }
}
