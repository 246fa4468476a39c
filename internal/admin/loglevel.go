package admin

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// LogLevelHandler reads and changes the node's log level while it runs:
//
//	GET /log-level               {"level":"info"}
//	PUT /log-level?level=debug   the same answer, after the change
//
// The level is what --log-level takes (debug, info, warn, error, in any
// case, or one with an offset such as info+2: slog.Level's text form); it
// applies to every line logged from then on, the access log's included
// (level info), and lasts until the process exits: a restart takes
// --log-level again. A change is logged, at the new level or info,
// whichever is higher, so that it shows under both levels. level nil: the
// level is fixed and the endpoint answers 501.
func LogLevelHandler(level *slog.LevelVar, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if level == nil {
			plain(w, http.StatusNotImplemented, "the log level is fixed: this node was not given a changeable level")
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPut:
			q, err := queryparam.Strict(r.URL.RawQuery, "level=debug|info|warn|error", "level")
			if err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
			if !q.Has("level") {
				plain(w, http.StatusBadRequest, "missing level parameter: level=debug|info|warn|error")
				return
			}
			name, err := queryparam.One("level", q["level"])
			if err != nil {
				plain(w, http.StatusBadRequest, err.Error())
				return
			}
			var l slog.Level
			if err := l.UnmarshalText([]byte(name)); err != nil {
				plain(w, http.StatusBadRequest, fmt.Sprintf("level %q: want debug, info, warn or error", name))
				return
			}
			old := level.Level()
			level.Set(l)
			if log != nil {
				log.Log(r.Context(), max(l, slog.LevelInfo), "log level changed", "from", levelName(old), "to", levelName(l), "by", r.RemoteAddr)
			}
		default:
			w.Header().Set("Allow", "GET, PUT")
			plain(w, http.StatusMethodNotAllowed, "method not allowed: GET, PUT")
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, map[string]string{"level": levelName(level.Level())})
	})
}

// levelName is l as --log-level writes it: "info", "debug-4".
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }
