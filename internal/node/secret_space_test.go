package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadSecretRefusesEdgeWhitespace: a secret the nodes cannot send as
// it is is refused at start. HTTP header values lose their leading and
// trailing spaces and tabs on the way (fasthttp trims them), so with
// "s3cret " every node sends "s3cret " and receives "s3cret": every
// internal request, the map log's upgrade included, gets 403.
func TestLoadSecretRefusesEdgeWhitespace(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"trailing space": "0123456789abcdef \n",
		"leading tab":    "\t0123456789abcdef\n",
	} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		cfg := Config{ClusterSecretFile: p}
		_, err := loadSecret(&cfg)
		require.Error(t, err, "%s: loaded as %q, which no peer's request can carry", name, cfg.ClusterSecret)
	}
}
