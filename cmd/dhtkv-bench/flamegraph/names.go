package flamegraph

import "regexp"

// The rule of pprof's internal/graph.ShortenFunctionName for Go symbols.
var (
	// goVersion matches a major-version element of a module path
	// ("github.com/cockroachdb/pebble/v2.(*DB).Get"), which is dropped
	// before the package path is.
	goVersion = regexp.MustCompile(`^(.*?)/v(?:[2-9]|[1-9][0-9]+)([./].*)$`)
	// goPath matches an import path's directories up to the last slash
	// before the package name; the group is package.Func and everything
	// after it (receiver, closures, type parameters).
	goPath = regexp.MustCompile(`^(?:[\w\-\.]+\/)+([^.]+\..+)`)
)

// ShortName shortens a Go function name the way pprof labels its flame
// graph frames: the import path's directories and a module's /vN suffix
// are dropped and the package name is kept, so
// "github.com/dhtkv/dhtkv/internal/store.(*Store).Get" becomes
// "store.(*Store).Get". Names without a path ("runtime.mallocgc"), and
// anything that is not a Go symbol (an address, "all"), are returned
// unchanged. Two packages with the same name in different paths shorten
// to the same text: the frames are still told apart by their full names,
// which the tooltips show.
func ShortName(fn string) string {
	fn = goVersion.ReplaceAllString(fn, `${1}${2}`)
	if m := goPath.FindStringSubmatch(fn); m != nil {
		return m[1]
	}
	return fn
}
