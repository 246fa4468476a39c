// Package buildinfo says which build of dhtkv is running: the version that
// the binaries print for --version, that a node reports in
// /v0/status?verbose and exports as the dhtkv_build_info metric.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version is set at link time by make build, from git describe:
//
//	go build -ldflags "-X github.com/dhtkv/dhtkv/internal/buildinfo.version=v1.2.0-3-gabcdef0"
//
// It is empty otherwise, and never written at run time.
var version string

// Version is the running build's version, the first of these that is
// known: the one make build linked in (git describe); the main module's
// version as the go command stamped it (a tag, or a pseudo-version made
// from the VCS revision, with +dirty for a modified tree); the VCS revision
// alone; "(devel)" (a test binary, or a build outside a repository).
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "(devel)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// GoVersion is the Go release the binary was built with.
func GoVersion() string { return runtime.Version() }
