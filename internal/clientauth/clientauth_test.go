package clientauth

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	readTok  = "read-token-0123456789"
	writeTok = "write-token-0123456789"
	adminTok = "admin-token-0123456789"
)

func writeFile(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// TestParse: every rule of the file format, each bad file refused whole
// with FILE:LINE and the reason, each good one read as meant.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		err           string // "" for a file that loads; else the error, after "tokens"
		read, write   int    // tokens per role of a file that loads
		admin         int
	}{
		{name: "one of each", content: "read " + readTok + "\nwrite " + writeTok + "\nadmin " + adminTok + "\n", read: 1, write: 1, admin: 1},
		{name: "no final newline", content: "read " + readTok, read: 1},
		{name: "comments and blank lines", content: "# tokens\n\n   # indented comment\nread " + readTok + "   # the dashboard\n\t\nwrite\t" + writeTok + " #x\n", read: 1, write: 1},
		{name: "CRLF", content: "# windows\r\nread " + readTok + "\r\nadmin " + adminTok + "\r\n", read: 1, admin: 1},
		{name: "padding", content: "read " + readTok + "==\n", read: 1},
		{name: "b64token characters", content: "read aZ09-._~+/aZ09-._~+/==\n", read: 1},
		{name: "two of one role", content: "read " + readTok + "\nread " + writeTok + "\n", read: 2},
		{name: "minimum length", content: "read " + strings.Repeat("x", MinTokenLen) + "\n", read: 1},
		{name: "maximum length", content: "read " + strings.Repeat("x", MaxTokenLen) + "\n", read: 1},

		{name: "empty", content: "", err: ": no tokens (want lines of ROLE TOKEN): a node with none would refuse every client"},
		{name: "comments only", content: "# nothing yet\n\n", err: ": no tokens"},
		{name: "CRLF blank lines only", content: "\r\n\r\n", err: ": no tokens"},
		{name: "duplicate token", content: "read " + readTok + "\n# x\nadmin " + readTok + "\n", err: ":3: the token of line 1 again: a token appears once, with one role"},
		{name: "duplicate token, same role", content: "write " + writeTok + "\nwrite " + writeTok + "\n", err: ":2: the token of line 1 again"},
		{name: "unknown role", content: "read " + readTok + "\nreader " + writeTok + "\n", err: `:2: unknown role "reader": want read, write or admin`},
		{name: "role in capitals", content: "ADMIN " + adminTok + "\n", err: `:1: unknown role "ADMIN"`},
		{name: "role none", content: "none " + adminTok + "\n", err: `:1: unknown role "none"`},
		{name: "too short", content: "\n\nread 0123456789abcde\n", err: ":3: token of 15 characters: at least 16"},
		{name: "too long", content: "read " + strings.Repeat("x", MaxTokenLen+1) + "\n", err: ":1: token of 1025 characters: at most 1024"},
		{name: "token alone", content: readTok + "\n", err: ":1: want ROLE TOKEN, found 1 fields"},
		{name: "role alone", content: "read\n", err: ":1: want ROLE TOKEN, found 1 fields"},
		{name: "three fields", content: "read " + readTok + " dashboard\n", err: ":1: want ROLE TOKEN, found 3 fields"},
		{name: "token first", content: readTok + " read\n", err: `:1: unknown role "` + readTok + `"`},
		{name: "bad character", content: "read " + readTok + "#x\n", err: `:1: token: character '#' is not allowed`},
		{name: "quoted", content: `read "` + readTok + `"` + "\n", err: `:1: token: character '"' is not allowed`},
		{name: "padding inside", content: "read abc=defghijklmnopq\n", err: ":1: token: = only at the end"},
		{name: "non-ASCII", content: "read " + readTok + "é\n", err: ":1: token: byte 0xc3 is not allowed"},
		{name: "line too long", content: "read " + readTok + "\nread " + strings.Repeat("x", 70000) + "\n", err: ":2: line too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parse("tokens", strings.NewReader(tc.content))
			if tc.err != "" {
				require.Error(t, err)
				assert.True(t, strings.HasPrefix(err.Error(), "tokens"+tc.err), "got %q, want tokens%s...", err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, [nRoles]int{0, tc.read, tc.write, tc.admin}, s.count)
		})
	}
	t.Run("too many", func(t *testing.T) {
		var b strings.Builder
		for i := range MaxTokens + 1 {
			fmt.Fprintf(&b, "read token-%016d\n", i)
		}
		_, err := parse("tokens", strings.NewReader(b.String()))
		require.EqualError(t, err, fmt.Sprintf("tokens:%d: more than %d tokens", MaxTokens+1, MaxTokens))
	})
}

// TestCRLFTokenHasNoCR: a token on a CRLF line is the token, without the
// CR: a client sending it is let in.
func TestCRLFTokenHasNoCR(t *testing.T) {
	tok, err := Load(writeFile(t, "write "+writeTok+"\r\n"))
	require.NoError(t, err)
	assert.Equal(t, Allowed, tok.Authorize([]byte("Bearer "+writeTok), Write).Outcome)
	assert.Equal(t, UnknownToken, tok.Authorize([]byte("Bearer "+writeTok+"\r"), Write).Outcome)
}

// TestAuthorize: every outcome, its status, reason and challenge.
func TestAuthorize(t *testing.T) {
	tok, err := Load(writeFile(t, "read "+readTok+"\nwrite "+writeTok+"\nadmin "+adminTok+"\n"))
	require.NoError(t, err)
	for _, tc := range []struct {
		name, header string
		need         Role
		out          Outcome
		code         int
		reason       string
		challenge    string
	}{
		{"open, no token", "", None, Allowed, 200, "", ""},
		{"open, unknown token", "Bearer nope", None, Allowed, 200, "", ""},
		{"no token", "", Read, NoToken, 401, "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)", `Bearer realm="dhtkv"`},
		{"basic", "Basic dXNlcjpwYXNz", Read, NotBearer, 401, "unauthorized: the Authorization header must be Bearer TOKEN", `Bearer realm="dhtkv"`},
		{"bearer without token", "Bearer ", Read, NotBearer, 401, "unauthorized: the Authorization header must be Bearer TOKEN", `Bearer realm="dhtkv"`},
		{"token without scheme", readTok, Read, NotBearer, 401, "unauthorized: the Authorization header must be Bearer TOKEN", `Bearer realm="dhtkv"`},
		{"unknown", "Bearer " + readTok + "x", Read, UnknownToken, 401, "unauthorized: unknown token", `Bearer realm="dhtkv", error="invalid_token"`},
		{"prefix of a token", "Bearer " + readTok[:len(readTok)-1], Read, UnknownToken, 401, "unauthorized: unknown token", `Bearer realm="dhtkv", error="invalid_token"`},
		{"read reads", "Bearer " + readTok, Read, Allowed, 200, "", ""},
		{"scheme in any case", "bEARER " + readTok, Read, Allowed, 200, "", ""},
		{"read cannot write", "Bearer " + readTok, Write, Forbidden, 403, "forbidden: this request needs the write role; the token's is read", `Bearer realm="dhtkv", error="insufficient_scope"`},
		{"read cannot administer", "Bearer " + readTok, Admin, Forbidden, 403, "forbidden: this request needs the admin role; the token's is read", `Bearer realm="dhtkv", error="insufficient_scope"`},
		{"write reads", "Bearer " + writeTok, Read, Allowed, 200, "", ""},
		{"write writes", "Bearer " + writeTok, Write, Allowed, 200, "", ""},
		{"write cannot administer", "Bearer " + writeTok, Admin, Forbidden, 403, "forbidden: this request needs the admin role; the token's is write", `Bearer realm="dhtkv", error="insufficient_scope"`},
		{"admin reads", "Bearer " + adminTok, Read, Allowed, 200, "", ""},
		{"admin writes", "Bearer " + adminTok, Write, Allowed, 200, "", ""},
		{"admin administers", "Bearer " + adminTok, Admin, Allowed, 200, "", ""},
	} {
		d := tok.Authorize([]byte(tc.header), tc.need)
		assert.Equal(t, tc.out, d.Outcome, tc.name)
		assert.Equal(t, tc.code, d.StatusCode(), tc.name)
		assert.Equal(t, tc.reason, d.Reason(), tc.name)
		assert.Equal(t, tc.challenge, d.Challenge(), tc.name)
	}
	var off *Tokens
	assert.Equal(t, Allowed, off.Authorize(nil, Admin).Outcome, "nil Tokens: authentication off")
}

// TestReload: a reload takes a new file whole; a bad one keeps the tokens
// in use and says why.
func TestReload(t *testing.T) {
	path := writeFile(t, "read "+readTok+"\n")
	tok, err := Load(path)
	require.NoError(t, err)
	require.Equal(t, Allowed, tok.Authorize([]byte("Bearer "+readTok), Read).Outcome)

	require.NoError(t, os.WriteFile(path, []byte("admin "+adminTok+"\n"), 0o600))
	require.NoError(t, tok.Reload())
	assert.Equal(t, UnknownToken, tok.Authorize([]byte("Bearer "+readTok), Read).Outcome, "removed")
	assert.Equal(t, Allowed, tok.Authorize([]byte("Bearer "+adminTok), Admin).Outcome, "added")

	require.NoError(t, os.WriteFile(path, []byte("admin "+adminTok+"\nwrite "+writeTok+"\nsuper "+readTok+"\n"), 0o600))
	require.EqualError(t, tok.Reload(), path+`:3: unknown role "super": want read, write or admin`)
	assert.Equal(t, Allowed, tok.Authorize([]byte("Bearer "+adminTok), Admin).Outcome, "the tokens in use stay")
	assert.Equal(t, UnknownToken, tok.Authorize([]byte("Bearer "+writeTok), Read).Outcome, "nothing of the bad file is taken")
	r, w, a := tok.Count()
	assert.Equal(t, [3]int{0, 0, 1}, [3]int{r, w, a})

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, tok.Reload(), "no such file")
	assert.Equal(t, Allowed, tok.Authorize([]byte("Bearer "+adminTok), Admin).Outcome, "the tokens in use stay")

	_, err = Load(path)
	require.ErrorContains(t, err, "client tokens: open "+path)
}

// TestAuthorizeAllocatesNothing: the check on every request's path.
func TestAuthorizeAllocatesNothing(t *testing.T) {
	tok, err := Load(writeFile(t, "read "+readTok+"\nwrite "+writeTok+"\nadmin "+adminTok+"\n"))
	require.NoError(t, err)
	for _, h := range []string{"Bearer " + writeTok, "Bearer " + readTok, "Bearer unknown-token-0000000", "", "Basic x"} {
		hdr := []byte(h)
		allocs := testing.AllocsPerRun(100, func() {
			d := tok.Authorize(hdr, Write)
			_, _, _ = d.StatusCode(), d.Reason(), d.Challenge()
		})
		assert.Zero(t, allocs, h)
	}
}

func TestFingerprint(t *testing.T) {
	// printf %s read-token-0123456789 | sha256sum
	assert.Equal(t, "sha256:d354526d", Fingerprint([]byte("Bearer "+readTok)))
	assert.Empty(t, Fingerprint([]byte("Basic x")))
}

func TestParseRole(t *testing.T) {
	for _, r := range []Role{Read, Write, Admin} {
		got, err := ParseRole(r.String())
		require.NoError(t, err)
		assert.Equal(t, r, got)
	}
	assert.True(t, Read < Write && Write < Admin, "read < write < admin")
}

// BenchmarkAuthorize: the cost on a request's path, by the number of
// tokens in the file (each request compares with all of them).
func BenchmarkAuthorize(b *testing.B) {
	for _, n := range []int{1, 10, MaxTokens} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			var c strings.Builder
			for i := range n - 1 {
				fmt.Fprintf(&c, "read token-%016d\n", i)
			}
			c.WriteString("write " + writeTok + "\n")
			tok, err := Load(writeFile(b, c.String()))
			require.NoError(b, err)
			hdr := []byte("Bearer " + writeTok)
			b.ReportAllocs()
			for b.Loop() {
				if tok.Authorize(hdr, Write).Outcome != Allowed {
					b.Fatal("refused")
				}
			}
		})
	}
}
