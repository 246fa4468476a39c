package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
)

// pebbleCheckpointer is what the store does: Pebble's own checkpoint, the
// WAL synced first.
type pebbleCheckpointer struct{ db *pebble.DB }

func (p pebbleCheckpointer) Checkpoint(dir string) error {
	return p.db.Checkpoint(dir, pebble.WithFlushedWAL())
}

// checkpointerFunc adapts a function (a failing or blocking store).
type checkpointerFunc func(dir string) error

func (f checkpointerFunc) Checkpoint(dir string) error { return f(dir) }

func post(t *testing.T, srv *httptest.Server, method, query string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+"/snapshot?"+query, nil)
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestSnapshotHandler: a real Pebble database is checkpointed through
// the handler while it takes writes; the checkpoint opens on its own and
// holds exactly what was written before the request, the writes synced
// or not. The request's rules, one row each.
func TestSnapshotHandler(t *testing.T) {
	db, err := pebble.Open(filepath.Join(t.TempDir(), "db"), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	for i := range 100 {
		opt := pebble.NoSync
		if i%10 == 0 {
			opt = pebble.Sync
		}
		require.NoError(t, db.Set(fmt.Appendf(nil, "k%03d", i), []byte("v"), opt))
	}
	log := slog.New(slog.DiscardHandler)
	srv := httptest.NewServer(SnapshotHandler(pebbleCheckpointer{db}, log))
	defer srv.Close()
	base := t.TempDir()
	dir := filepath.Join(base, "backups", "one") // parents are created

	code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(dir))
	require.Equal(t, http.StatusOK, code, body)
	var s client.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	assert.Equal(t, dir, s.Dir)
	assert.Positive(t, s.Files)
	assert.Positive(t, s.Bytes)
	require.NoError(t, db.Set([]byte("after"), []byte("v"), pebble.Sync))

	cp, err := pebble.Open(dir, &pebble.Options{ReadOnly: true})
	require.NoError(t, err)
	defer cp.Close()
	it, err := cp.NewIter(nil)
	require.NoError(t, err)
	n := 0
	for it.First(); it.Valid(); it.Next() {
		assert.Equal(t, fmt.Sprintf("k%03d", n), string(it.Key()))
		n++
	}
	require.NoError(t, it.Close())
	assert.Equal(t, 100, n, "every write before the snapshot, none after")

	existing := t.TempDir()
	for _, tc := range []struct {
		name, method, query string
		cp                  Checkpointer
		code                int
		reason              string
	}{
		{"GET", http.MethodGet, "dir=" + filepath.Join(base, "x"), pebbleCheckpointer{db}, 405, "use POST"},
		{"no dir", http.MethodPost, "", pebbleCheckpointer{db}, 400, "missing dir"},
		{"empty dir", http.MethodPost, "dir=", pebbleCheckpointer{db}, 400, "missing dir"},
		{"relative dir", http.MethodPost, "dir=backups/x", pebbleCheckpointer{db}, 400, "not an absolute path"},
		{"existing dir", http.MethodPost, "dir=" + url.QueryEscape(existing), pebbleCheckpointer{db}, 409, "already exists"},
		{"the last snapshot's dir", http.MethodPost, "dir=" + url.QueryEscape(dir), pebbleCheckpointer{db}, 409, "already exists"},
		{"a store that cannot checkpoint", http.MethodPost, "dir=" + url.QueryEscape(filepath.Join(base, "y")), nil, 501, "cannot make snapshots"},
		{"a failed checkpoint", http.MethodPost, "dir=" + url.QueryEscape(filepath.Join(base, "z")),
			checkpointerFunc(func(string) error { return errors.New("disk full") }), 500, "snapshot failed: disk full"},
	} {
		srv := httptest.NewServer(SnapshotHandler(tc.cp, log))
		code, body := post(t, srv, tc.method, tc.query)
		srv.Close()
		assert.Equal(t, tc.code, code, "%s: %s", tc.name, body)
		assert.Contains(t, body, tc.reason, tc.name)
		assert.Equal(t, 1, strings.Count(body, "\n"), "%s: one line", tc.name)
	}
	_, err = os.Stat(filepath.Join(base, "y"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestSnapshotOneAtATime: while a checkpoint runs, another request is
// refused (409), and accepted again once it ended.
func TestSnapshotOneAtATime(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cp := checkpointerFunc(func(dir string) error {
		once.Do(func() { // the first checkpoint waits for release
			close(started)
			<-release
		})
		return os.Mkdir(dir, 0o700)
	})
	srv := httptest.NewServer(SnapshotHandler(cp, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	base := t.TempDir()
	first := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Post(srv.URL+"/snapshot?dir="+url.QueryEscape(filepath.Join(base, "a")), "", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("first snapshot: %d", resp.StatusCode)
			}
		}
		first <- err
	}()
	<-started
	code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(filepath.Join(base, "b")))
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "already running")
	close(release)
	require.NoError(t, <-first)
	code, body = post(t, srv, http.MethodPost, "dir="+url.QueryEscape(filepath.Join(base, "b")))
	assert.Equal(t, http.StatusOK, code, body)
}
