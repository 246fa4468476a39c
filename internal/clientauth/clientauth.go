// Package clientauth holds the bearer tokens a node's clients authenticate
// with (--client-tokens), each with a role, and decides whether a request's
// Authorization header carries a token of the role it needs
// (docs/security.md, "Client authentication").
//
// The token file has one token a line, its role first:
//
//	# comment
//	read   0d7c1b7f3e6a4c2b9f8e5d4c3b2a1f0e
//	write  Q2xpZW50LXRva2VuLWZvci13cml0ZXM=   # the ingest job
//	admin  b3BlcmF0b3ItdG9rZW4tMjAyNi0wNg==
//
// Blank lines are skipped, and a field that starts with # begins a comment
// that runs to the end of the line; CRLF line ends are read as LF. A role
// is read, write or admin, each allowing what the ones before it allow. A
// token is 16 to 1024 characters of RFC 6750's b64token set (letters,
// digits, - . _ ~ + /, then = padding), so that it fits an Authorization
// header as it is, and appears once in the file. A file that breaks a rule
// is refused whole, with FILE:LINE and the reason; a file without tokens
// too, as it would refuse every client, and one of more than MaxTokens.
//
// Only the tokens' SHA-256 digests are kept, so that a core dump or a heap
// inspection shows none. A request's token is hashed and its digest
// compared with every stored one with crypto/subtle, to the end of the
// list: the time taken depends on how many tokens there are (at most
// MaxTokens), not on which one matched or on how many bytes did. Hashing
// first also makes every comparison 32 bytes, whatever the tokens'
// lengths. The tokens are reloaded as a whole, by one atomic swap
// (Reload), so that a request sees the old set or the new one, never a
// mix.
package clientauth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
)

// Role is what a token allows. Each role allows what the roles below it
// allow: read < write < admin.
type Role uint8

const (
	// None is no role: what a request without a token may do, and what an
	// open endpoint needs.
	None Role = iota
	// Read allows GET and HEAD of keys and ranges, and reading the admin
	// port's state (GET /cluster, GET /repair).
	Read
	// Write allows PUT and DELETE, and what Read allows.
	Write
	// Admin allows every admin endpoint that changes the node or the
	// cluster (membership changes, snapshots, repairs, profiling), and
	// what Write allows.
	Admin
	nRoles
)

var roleNames = [nRoles]string{"none", "read", "write", "admin"}

func (r Role) String() string {
	if r < nRoles {
		return roleNames[r]
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// ParseRole is the role named s: read, write or admin.
func ParseRole(s string) (Role, error) {
	for r := Read; r < nRoles; r++ {
		if s == roleNames[r] {
			return r, nil
		}
	}
	return None, fmt.Errorf("unknown role %q: want read, write or admin", s)
}

// MinTokenLen and MaxTokenLen bound a token's length in characters. 16
// characters are 64 bits of randomness as hex (openssl rand -hex 16 makes
// 32 characters, 128 bits); beyond 1024 an Authorization header starts to
// crowd a node's --max-header-bytes.
const (
	MinTokenLen = 16
	MaxTokenLen = 1024
)

// MaxTokens bounds the tokens of one file: every request compares its
// token's digest with all of them, some 20 ns each (docs/security.md).
// Roles are few; 64 leave room for every client to hold a token of its
// own, and for the old and new token of each during a rotation.
const MaxTokens = 64

// digest is a token's SHA-256.
type digest = [sha256.Size]byte

// set is one generation of tokens.
type set struct {
	tokens []entry     // each digest once
	count  [nRoles]int // tokens per role
}

type entry struct {
	digest digest
	role   Role
}

// Tokens are the tokens a node accepts, read from a file, and reloaded
// from it on demand (Reload). A nil *Tokens is client authentication off:
// every request is allowed. Safe for concurrent use.
type Tokens struct {
	path string
	cur  atomic.Pointer[set]
}

// Load reads the token file at path (the package comment's format).
func Load(path string) (*Tokens, error) {
	s, err := readFile(path)
	if err != nil {
		return nil, err
	}
	t := &Tokens{path: path}
	t.cur.Store(s)
	return t, nil
}

// Path is the file the tokens are read from.
func (t *Tokens) Path() string { return t.path }

// Reload reads the file again and, if it passes every rule, makes its
// tokens the ones every later request is checked against. A file that does
// not pass changes nothing: the tokens in use stay, and the error says why.
func (t *Tokens) Reload() error {
	s, err := readFile(t.path)
	if err != nil {
		return err
	}
	t.cur.Store(s)
	return nil
}

// Count is how many tokens of each role are in use: read, write, admin.
func (t *Tokens) Count() (read, write, admin int) {
	s := t.cur.Load()
	return s.count[Read], s.count[Write], s.count[Admin]
}

// readFile reads and parses the token file at path.
func readFile(path string) (*set, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("client tokens: %w", err)
	}
	defer f.Close()
	return parse(path, f)
}

// parse reads a token file's content from r; name is the file's name, for
// the errors (name:line: reason).
func parse(name string, r io.Reader) (*set, error) {
	s := &set{}
	lineOf := map[digest]int{}
	sc := bufio.NewScanner(r)
	// A line holds a role and a token of at most MaxTokenLen, and a
	// comment: bufio's default 64 KiB is room enough, and a longer line
	// is refused with the line's number.
	n := 0
	for sc.Scan() {
		n++
		fields := strings.Fields(sc.Text()) // a CR before the LF is a space here
		for i, f := range fields {
			if strings.HasPrefix(f, "#") {
				fields = fields[:i]
				break
			}
		}
		switch len(fields) {
		case 0:
			continue
		case 2:
		default:
			return nil, fmt.Errorf("%s:%d: want ROLE TOKEN, found %d fields", name, n, len(fields))
		}
		role, err := ParseRole(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if err := checkToken(fields[1]); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		d := sha256.Sum256([]byte(fields[1]))
		if first, dup := lineOf[d]; dup {
			return nil, fmt.Errorf("%s:%d: the token of line %d again: a token appears once, with one role", name, n, first)
		}
		if len(s.tokens) == MaxTokens {
			return nil, fmt.Errorf("%s:%d: more than %d tokens", name, n, MaxTokens)
		}
		lineOf[d] = n
		s.tokens = append(s.tokens, entry{d, role})
		s.count[role]++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%s:%d: line too long", name, n+1)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(s.tokens) == 0 {
		return nil, fmt.Errorf("%s: no tokens (want lines of ROLE TOKEN): a node with none would refuse every client", name)
	}
	return s, nil
}

// checkToken says why tok cannot be a token, or nil.
func checkToken(tok string) error {
	switch {
	case len(tok) < MinTokenLen:
		return fmt.Errorf("token of %d characters: at least %d (e.g. openssl rand -hex 16)", len(tok), MinTokenLen)
	case len(tok) > MaxTokenLen:
		return fmt.Errorf("token of %d characters: at most %d", len(tok), MaxTokenLen)
	}
	pad := false
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c == '=':
			pad = true
		case pad:
			return errors.New("token: = only at the end (RFC 6750 b64token)")
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '-', c == '.', c == '_', c == '~', c == '+', c == '/':
		default:
			what := fmt.Sprintf("character %q", c)
			if c <= ' ' || c > '~' {
				what = fmt.Sprintf("byte 0x%02x", c)
			}
			return fmt.Errorf("token: %s is not allowed: letters, digits, - . _ ~ + / and = at the end (RFC 6750 b64token)", what)
		}
	}
	return nil
}

// Outcome is what a request's Authorization header amounts to.
type Outcome uint8

const (
	// Allowed: the request may proceed (it needs no role, or its token
	// has the role it needs, or client authentication is off).
	Allowed Outcome = iota
	// NoToken: it needs a role and carries no Authorization header (401).
	NoToken
	// NotBearer: its Authorization header is not "Bearer TOKEN" (401).
	NotBearer
	// UnknownToken: its token is none of the node's (401).
	UnknownToken
	// Forbidden: its token's role is below the one it needs (403).
	Forbidden
)

// Decision is the answer to one request.
type Decision struct {
	Outcome Outcome
	// Role is the role of the request's token (None without one known).
	Role Role
	// Need is the role the request needed.
	Need Role
}

// StatusCode is the HTTP status of a refusal: 401 for a request without a
// known token, 403 for one whose token's role is too low; 200 when allowed.
func (d Decision) StatusCode() int {
	switch d.Outcome {
	case Allowed:
		return 200
	case Forbidden:
		return 403
	}
	return 401
}

// Reason is a refusal's one-line reason ("" when allowed). It allocates
// nothing: the lines are made once.
func (d Decision) Reason() string {
	if d.Outcome == Forbidden {
		return forbidden[d.Need][d.Role]
	}
	return reasons[d.Outcome]
}

var reasons = [...]string{
	Allowed:      "",
	NoToken:      "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)",
	NotBearer:    "unauthorized: the Authorization header must be Bearer TOKEN",
	UnknownToken: "unauthorized: unknown token",
}

// forbidden[need][has] is the 403 reason.
var forbidden = func() (f [nRoles][nRoles]string) {
	for need := range nRoles {
		for has := range nRoles {
			f[need][has] = fmt.Sprintf("forbidden: this request needs the %s role; the token's is %s", need, has)
		}
	}
	return f
}()

// Challenge is the WWW-Authenticate header of a refusal (RFC 6750 §3): a
// 401 without a token names the scheme only; one with a token that is not
// known says invalid_token; a 403, insufficient_scope.
func (d Decision) Challenge() string {
	switch d.Outcome {
	case NoToken, NotBearer:
		return `Bearer realm="dhtkv"`
	case UnknownToken:
		return `Bearer realm="dhtkv", error="invalid_token"`
	case Forbidden:
		return `Bearer realm="dhtkv", error="insufficient_scope"`
	}
	return ""
}

// Authorize decides a request that needs role need and carries the
// Authorization header authorization (empty when it has none). A nil t
// allows everything. It allocates nothing.
func (t *Tokens) Authorize(authorization []byte, need Role) Decision {
	if t == nil || need == None {
		return Decision{Outcome: Allowed, Need: need}
	}
	tok, ok := bearer(authorization)
	switch {
	case len(authorization) == 0:
		return Decision{Outcome: NoToken, Need: need}
	case !ok:
		return Decision{Outcome: NotBearer, Need: need}
	}
	role := t.role(tok)
	switch {
	case role == None:
		return Decision{Outcome: UnknownToken, Need: need}
	case role < need:
		return Decision{Outcome: Forbidden, Role: role, Need: need}
	}
	return Decision{Outcome: Allowed, Role: role, Need: need}
}

// role is the role of token tok, None if it is not one of the tokens. It
// compares tok's digest with every stored one, in constant time and to the
// end: its time depends on the number of tokens only.
func (t *Tokens) role(tok []byte) Role {
	d := sha256.Sum256(tok)
	role := int(None)
	for _, e := range t.cur.Load().tokens {
		role = subtle.ConstantTimeSelect(subtle.ConstantTimeCompare(e.digest[:], d[:]), int(e.role), role)
	}
	return Role(role)
}

// bearer returns the token of an Authorization header "Bearer TOKEN" (the
// scheme's case is not significant, RFC 9110 §11.1), and whether it is
// one.
func bearer(h []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) {
		return nil, false
	}
	for i := range len(scheme) {
		c := h[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != scheme[i] {
			return nil, false
		}
	}
	tok := bytes.TrimLeft(h[len(scheme):], " ")
	return tok, len(tok) > 0
}

// Fingerprint names a token in logs without giving it away: "sha256:" and
// the first 8 hex digits of its digest (printf %s TOKEN | sha256sum).
func Fingerprint(authorization []byte) string {
	tok, ok := bearer(authorization)
	if !ok {
		return ""
	}
	d := sha256.Sum256(tok)
	return "sha256:" + hex.EncodeToString(d[:4])
}
