package flamegraph

import "testing"

func TestShortName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// Already short: standard library packages without a path, main.
		{"runtime.mallocgc", "runtime.mallocgc"},
		{"main.main", "main.main"},
		{"sync.(*Mutex).Lock", "sync.(*Mutex).Lock"},
		// A standard library path loses its directories.
		{"internal/poll.(*FD).Read", "poll.(*FD).Read"},
		{"crypto/tls.(*Conn).Read", "tls.(*Conn).Read"},
		// Module paths: methods, closures, receivers by value.
		{"github.com/dhtkv/dhtkv/internal/store.(*Store).Get", "store.(*Store).Get"},
		{"github.com/dhtkv/dhtkv/internal/store.(*Store).Get.func1", "store.(*Store).Get.func1"},
		{"github.com/valyala/fasthttp.(*Server).serveConn", "fasthttp.(*Server).serveConn"},
		{"golang.org/x/sys/unix.Syscall", "unix.Syscall"},
		{"github.com/dhtkv/dhtkv/internal/replica.VersionFilter.Raise", "replica.VersionFilter.Raise"},
		// A module's major version is dropped with the path, at the end of
		// the path or inside it; v1 and words starting with v are not versions.
		{"github.com/cockroachdb/pebble/v2.(*DB).Get", "pebble.(*DB).Get"},
		{"github.com/cockroachdb/pebble/v2/internal/base.(*InternalKey).Encode", "base.(*InternalKey).Encode"},
		{"github.com/x/y/v10.F", "y.F"},
		{"github.com/x/v1.F", "v1.F"},
		{"github.com/hashicorp/vault.F", "vault.F"},
		// A dotted package name (gopkg.in) keeps its suffix, as in pprof.
		{"gopkg.in/yaml.v3.(*parser).parse", "yaml.v3.(*parser).parse"},
		// Type parameters keep the paths of their arguments.
		{"github.com/a/b.Map[go.shape.string,go.shape.int]", "b.Map[go.shape.string,go.shape.int]"},
		{"github.com/a/b.F[github.com/c/d.T]", "b.F[github.com/c/d.T]"},
		// Not Go symbols: left alone.
		{"0x4a2b3c", "0x4a2b3c"},
		{"all", "all"},
		{"", ""},
	} {
		if got := ShortName(tc.in); got != tc.want {
			t.Errorf("ShortName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
