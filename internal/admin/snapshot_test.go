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
	"time"
	"unicode"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/store"
)

// pebbleCheckpointer is what the store does: Pebble's own checkpoint, the
// WAL synced first.
type pebbleCheckpointer struct{ db *pebble.DB }

func (p pebbleCheckpointer) Checkpoint(dir string) (time.Time, error) {
	return time.Time{}, p.db.Checkpoint(dir, pebble.WithFlushedWAL())
}

// checkpointerFunc adapts a function (a failing or blocking store).
type checkpointerFunc func(dir string) error

func (f checkpointerFunc) Checkpoint(dir string) (time.Time, error) { return time.Time{}, f(dir) }

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
	base := t.TempDir() // --snapshot-dir
	srv := httptest.NewServer(SnapshotHandler(pebbleCheckpointer{db}, base, log))
	defer srv.Close()
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

	// A path relative to --snapshot-dir is a path inside it.
	code, body = post(t, srv, http.MethodPost, "dir="+url.QueryEscape("backups/two"))
	require.Equal(t, http.StatusOK, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	assert.Equal(t, filepath.Join(base, "backups", "two"), s.Dir)
	manifests, err := filepath.Glob(filepath.Join(base, "backups", "two", "MANIFEST-*"))
	require.NoError(t, err)
	assert.NotEmpty(t, manifests, "a Pebble directory")

	existing := filepath.Join(base, "existing")
	require.NoError(t, os.Mkdir(existing, 0o700))
	outside := t.TempDir() // not inside --snapshot-dir
	require.NoError(t, os.Symlink(outside, filepath.Join(base, "out")))
	require.NoError(t, os.Symlink(existing, filepath.Join(base, "in"))) // a link that stays inside is refused too
	require.NoError(t, os.WriteFile(filepath.Join(base, "file"), nil, 0o600))
	esc := func(p string) string { return "dir=" + url.QueryEscape(p) }
	for _, tc := range []struct {
		name, method, query string
		cp                  Checkpointer
		code                int
		reason              string
	}{
		{"GET", http.MethodGet, esc(filepath.Join(base, "x")), pebbleCheckpointer{db}, 405, "use POST"},
		{"no dir", http.MethodPost, "", pebbleCheckpointer{db}, 400, "missing dir parameter: the new directory to write the snapshot to, inside --snapshot-dir " + base},
		{"empty dir", http.MethodPost, "dir=", pebbleCheckpointer{db}, 400, "missing dir"},
		{"outside", http.MethodPost, esc(filepath.Join(outside, "x")), pebbleCheckpointer{db}, 400, "outside --snapshot-dir " + base},
		{"a sibling sharing the prefix", http.MethodPost, esc(base + "x/y"), pebbleCheckpointer{db}, 400, "outside --snapshot-dir"},
		{"the root", http.MethodPost, esc("/"), pebbleCheckpointer{db}, 400, "outside --snapshot-dir"},
		{"--snapshot-dir itself", http.MethodPost, esc(base), pebbleCheckpointer{db}, 400, "is --snapshot-dir " + base + " itself"},
		{"dot", http.MethodPost, esc("."), pebbleCheckpointer{db}, 400, "itself"},
		{"relative ..", http.MethodPost, esc("../x"), pebbleCheckpointer{db}, 400, "must not contain .."},
		{"relative .. deeper", http.MethodPost, esc("backups/../../x"), pebbleCheckpointer{db}, 400, "must not contain .."},
		{".. that stays inside", http.MethodPost, esc("backups/../x"), pebbleCheckpointer{db}, 400, "must not contain .."},
		{"absolute ..", http.MethodPost, esc(base + "/../x"), pebbleCheckpointer{db}, 400, "must not contain .."},
		{"through a link out", http.MethodPost, esc("out/x"), pebbleCheckpointer{db}, 400, fmt.Sprintf(`dir "out/x": %q is a symbolic link`, filepath.Join(base, "out"))},
		{"a link out", http.MethodPost, esc(filepath.Join(base, "out")), pebbleCheckpointer{db}, 400, "is a symbolic link"},
		{"through a link in", http.MethodPost, esc("in/x"), pebbleCheckpointer{db}, 400, "is a symbolic link"},
		{"through a file", http.MethodPost, esc("file/x"), pebbleCheckpointer{db}, 400, fmt.Sprintf("%q is not a directory", filepath.Join(base, "file"))},
		{"a NUL", http.MethodPost, "dir=%00", pebbleCheckpointer{db}, 400, `dir "\x00": contains a control character: name a directory inside --snapshot-dir ` + base},
		{"a newline", http.MethodPost, esc("a\nb"), pebbleCheckpointer{db}, 400, `dir "a\nb": contains a control character`},
		{"an escape sequence", http.MethodPost, esc("x\x1b[2J"), pebbleCheckpointer{db}, 400, `dir "x\x1b[2J": contains a control character`},
		{"unknown parameter", http.MethodPost, esc("new") + "&force=1", pebbleCheckpointer{db}, 400, `unknown parameter "force": dir=PATH, the new directory to write the snapshot to`},
		{"two dirs", http.MethodPost, esc("a") + "&" + esc("b"), pebbleCheckpointer{db}, 400, "dir given 2 times with different values: give it once"},
		{"malformed query", http.MethodPost, "dir=%zz", pebbleCheckpointer{db}, 400, `malformed query: invalid URL escape "%zz"`},
		{"existing dir", http.MethodPost, esc(existing), pebbleCheckpointer{db}, 409, fmt.Sprintf("dir %q already exists", existing)},
		{"existing dir, relative", http.MethodPost, esc("existing"), pebbleCheckpointer{db}, 409, "already exists"},
		{"the last snapshot's dir", http.MethodPost, esc(dir), pebbleCheckpointer{db}, 409, "already exists"},
		{"a store that cannot checkpoint", http.MethodPost, esc(filepath.Join(base, "y")), nil, 501, "cannot make snapshots"},
		{"a failed checkpoint", http.MethodPost, esc(filepath.Join(base, "z")),
			checkpointerFunc(func(string) error { return errors.New("disk full") }), 500, "snapshot failed: disk full"},
	} {
		srv := httptest.NewServer(SnapshotHandler(tc.cp, base, log))
		code, body := post(t, srv, tc.method, tc.query)
		srv.Close()
		assert.Equal(t, tc.code, code, "%s: %s", tc.name, body)
		assert.Contains(t, body, tc.reason, tc.name)
		assert.Equal(t, 1, strings.Count(body, "\n"), "%s: one line", tc.name)
		assert.False(t, strings.ContainsFunc(strings.TrimSuffix(body, "\n"), unicode.IsControl), "%s: no control character: %q", tc.name, body)
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written outside --snapshot-dir")
	_, err = os.Stat(filepath.Join(filepath.Dir(base), "x"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(base, "y"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(base, "new"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a refused request writes nothing")
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
	base := t.TempDir()
	srv := httptest.NewServer(SnapshotHandler(cp, base, slog.New(slog.DiscardHandler)))
	defer srv.Close()
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

// TestSnapshotDirTooLong: a dir whose name the filesystem cannot hold (a
// component over NAME_MAX, 255 bytes, below a directory that does not
// exist yet, or a path over PATH_MAX, less room for the checkpoint's own
// file names) is the request's fault: 400 with a
// short one-line reason, and the checkpoint is not tried. It was a 500
// "snapshot failed: ... file name too long" whose reason echoed the whole
// path (kilobytes), and an error logged as the node's own failure.
func TestSnapshotDirTooLong(t *testing.T) {
	db, err := pebble.Open(filepath.Join(t.TempDir(), "db"), &pebble.Options{})
	require.NoError(t, err)
	defer db.Close()
	base := t.TempDir()
	srv := httptest.NewServer(SnapshotHandler(pebbleCheckpointer{db}, base, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	for _, dir := range []string{
		"new/" + strings.Repeat("a", 256), // a component over NAME_MAX under a missing parent
		strings.Repeat("a", 256),          // the same at the top (Lstat already refused it)
		strings.Repeat("d/", 2100) + "x",  // a path over PATH_MAX
	} {
		t.Run(fmt.Sprint(len(dir)), func(t *testing.T) {
			code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(dir))
			assert.Equal(t, http.StatusBadRequest, code, "%.200s", body)
			assert.Contains(t, body, "too long")
			assert.Less(t, len(body), 600, "a short reason: %.200s...", body)
			assert.Equal(t, 1, strings.Count(body, "\n"), "one line")
			entries, err := os.ReadDir(base)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing made in --snapshot-dir")
		})
	}
	// A long path that fits is still taken.
	ok := strings.Repeat(strings.Repeat("c", 200)+"/", 15) + "end"
	code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(ok))
	assert.Equal(t, http.StatusOK, code, "%.300s", body)
}

// storeCheckpointer is the node's: store.Store.Checkpoint, which writes
// the copy into a sibling "." + name + ".partial-" + a number first.
type storeCheckpointer struct{ s *store.Store }

func (c storeCheckpointer) Checkpoint(dir string) (time.Time, error) {
	return time.Time{}, c.s.Checkpoint(dir, time.Time{}, 0)
}

// TestSnapshotDirNameLeavesRoomForPartial: the store writes a snapshot
// into a sibling named "." + the last name + ".partial-" + a number, up to 23
// bytes longer than the name: a last name of 234 to 255 bytes passed
// TestSnapshotDirTooLong's NAME_MAX check, and the checkpoint then failed
// (500 "file name too long", quoting the path, after making the parents).
// It is refused from the name, as a longer one is; the longest name the
// store can take is still taken.
func TestSnapshotDirNameLeavesRoomForPartial(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.DefaultOptions())
	require.NoError(t, err)
	defer st.Close()
	base := t.TempDir()
	srv := httptest.NewServer(SnapshotHandler(storeCheckpointer{st}, base, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	for _, n := range []int{nameMax - partialNameRoom + 1, 250, nameMax} {
		dir := "new/" + strings.Repeat("a", n)
		code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(dir))
		assert.Equal(t, http.StatusBadRequest, code, "a last name of %d bytes: %.200s", n, body)
		assert.Contains(t, body, "too long")
		entries, err := os.ReadDir(base)
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing made in --snapshot-dir")
	}
	dir := "new/" + strings.Repeat("b", nameMax-partialNameRoom)
	code, body := post(t, srv, http.MethodPost, "dir="+url.QueryEscape(dir))
	assert.Equal(t, http.StatusOK, code, "%.300s", body)
}
