// Package buildinfo says which build of dhtkv is running: the version that
// the binaries print for --version, that a node reports in
// /v0/status?verbose and exports as the dhtkv_build_info metric.
package buildinfo

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
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

// EnvVar is the variable ff offers the binaries' --version flag (they
// read DHTKV_* variables for their flags), and a name builds and
// deployments commonly give the version they build or deploy
// (packaging/compose.yaml's build argument).
const EnvVar = "DHTKV_VERSION"

// Flag is a --version flag: a boolean that the variable EnvVar never
// sets. ff offers every flag its DHTKV_* variable, and a version exported
// there (v1.2.0-3-gabcdef0, or a build number such as 1) made every start
// and every command a usage error, or, when it parsed as a boolean, made
// every start print the version and exit 0. Set cannot tell the command
// line from the environment, so it leaves alone any value equal to
// EnvVar's: the one case it misreads is --version=X given with X exported
// as EnvVar too. Any other value that is not a boolean is an error. The
// zero value is false.
type Flag struct{ set bool }

// IsBoolFlag makes --version a flag without a value (flag.boolFlag).
func (f *Flag) IsBoolFlag() bool { return true }

// Set is flag.Value's.
func (f *Flag) Set(s string) error {
	if env := os.Getenv(EnvVar); env != "" && s == env {
		return nil // a version exported for something else
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	f.set = b
	return nil
}

// String is flag.Value's.
func (f *Flag) String() string {
	if f == nil {
		return "false"
	}
	return strconv.FormatBool(f.set)
}

// Asked reports whether --version was given.
func (f *Flag) Asked() bool { return f.set }
