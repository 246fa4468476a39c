package maplog

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"

	"github.com/hashicorp/go-hclog"
)

// slogger makes raft's hclog calls slog records of the node's logger:
// raft's Info becomes Debug (an election or a snapshot is routine, and
// raft says so at Info many times a change), Warn and Error stay, except
// an error on a connection this process closed itself (net.ErrClosed):
// raft's transport logs one for each connection it was reading when the
// node shuts down, which is no fault.
type slogger struct {
	l    *slog.Logger
	name string
	args []any
}

func newHCLog(l *slog.Logger) hclog.Logger {
	return &slogger{l: l.With("component", "maplog.raft")}
}

func level(lv hclog.Level) slog.Level {
	switch lv {
	case hclog.Trace, hclog.Debug, hclog.Info:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (s *slogger) Log(lv hclog.Level, msg string, args ...any) {
	l := level(lv)
	if l > slog.LevelDebug && closedHere(args) {
		l = slog.LevelDebug
	}
	s.l.Log(context.Background(), l, msg, append(append([]any{}, s.args...), args...)...)
}

// closedHere reports whether one of args is an error on a connection this
// process closed.
func closedHere(args []any) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && errors.Is(err, net.ErrClosed) {
			return true
		}
	}
	return false
}
func (s *slogger) Trace(msg string, args ...any) { s.Log(hclog.Trace, msg, args...) }
func (s *slogger) Debug(msg string, args ...any) { s.Log(hclog.Debug, msg, args...) }
func (s *slogger) Info(msg string, args ...any)  { s.Log(hclog.Info, msg, args...) }
func (s *slogger) Warn(msg string, args ...any)  { s.Log(hclog.Warn, msg, args...) }
func (s *slogger) Error(msg string, args ...any) { s.Log(hclog.Error, msg, args...) }
func (s *slogger) IsTrace() bool                 { return false }
func (s *slogger) IsDebug() bool                 { return s.l.Enabled(context.Background(), slog.LevelDebug) }
func (s *slogger) IsInfo() bool                  { return s.IsDebug() }
func (s *slogger) IsWarn() bool                  { return s.l.Enabled(context.Background(), slog.LevelWarn) }
func (s *slogger) IsError() bool                 { return s.l.Enabled(context.Background(), slog.LevelError) }
func (s *slogger) ImpliedArgs() []any            { return s.args }
func (s *slogger) With(args ...any) hclog.Logger {
	return &slogger{l: s.l, name: s.name, args: append(append([]any{}, s.args...), args...)}
}
func (s *slogger) Name() string { return s.name }
func (s *slogger) Named(name string) hclog.Logger {
	n := name
	if s.name != "" {
		n = s.name + "." + name
	}
	return &slogger{l: s.l.With("subsystem", n), name: n, args: s.args}
}
func (s *slogger) ResetNamed(name string) hclog.Logger {
	return &slogger{l: s.l.With("subsystem", name), name: name, args: s.args}
}
func (s *slogger) SetLevel(hclog.Level)  {}
func (s *slogger) GetLevel() hclog.Level { return hclog.Debug }
func (s *slogger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(s.l.Handler(), slog.LevelDebug)
}
func (s *slogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slog.NewLogLogger(s.l.Handler(), slog.LevelDebug).Writer()
}
