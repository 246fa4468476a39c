package maplog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/dhtkv/dhtkv/internal/lograte"
)

// slogger makes raft's hclog calls slog records of the node's logger:
// raft's Info becomes Debug (an election or a snapshot is routine, and
// raft says so at Info many times a change), Warn and Error stay, except
// an error on a connection this process closed itself (net.ErrClosed):
// raft's transport logs one for each connection it was reading when the
// node shuts down, which is no fault.
//
// A warning or an error about one peer is logged once per repeatWindow
// (lograte): raft logs one for every failed RPC and retries a peer it
// cannot reach every half second or so, which made a leader log some
// 2 errors a second per unreachable peer, thousands an hour.
type slogger struct {
	l    *slog.Logger
	name string
	args []any
	rep  *lograte.Limiter[repeatKey] // shared by the loggers With and Named derive
}

func newHCLog(l *slog.Logger) hclog.Logger { return newHCLogClock(l, time.Now) }

// newHCLogClock is newHCLog with the limiter's clock.
func newHCLogClock(l *slog.Logger, now func() time.Time) *slogger {
	return &slogger{l: l.With("component", "maplog.raft"), rep: lograte.New[repeatKey](repeatWindow, repeatMaxKeys, now)}
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
	if l == slog.LevelWarn && firstElection(msg, args) {
		l = slog.LevelInfo
	}
	all := append(append([]any{}, s.args...), args...)
	for i, a := range all {
		// hclog.Fmt's value ("servers", hclog.Fmt("%+v", ...) in raft's
		// "initial configuration"): hclog formats it, slog would print
		// the verb and its arguments as a list.
		if f, ok := a.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				all[i] = fmt.Sprintf(format, f[1:]...)
			}
		}
	}
	if l > slog.LevelDebug {
		if peer, ok := peerOf(all); ok {
			v := s.rep.Note(repeatKey{name: s.name, msg: msg, peer: peer})
			if !v.Log {
				return
			}
			if v.Suppressed > 0 {
				l = min(l, slog.LevelWarn)
				all = append(all, "suppressed", v.Suppressed, "suppressed_since", v.Since)
			}
		}
	}
	s.l.Log(context.Background(), l, msg, all...)
}

// firstElection reports whether msg is raft's "heartbeat timeout reached,
// starting election" of a server that has heard of no leader since it
// started (last-leader-id ""): every voter logs it at every start, before
// the group's first election, and a single node at each start. A warning
// there would teach operators to ignore the one that matters: the same
// message naming the leader that went silent, which stays a warning.
func firstElection(msg string, args []any) bool {
	if !strings.HasPrefix(msg, "heartbeat timeout reached") {
		return false
	}
	for i := 0; i+1 < len(args); i += 2 {
		if args[i] == "last-leader-id" {
			return fmt.Sprint(args[i+1]) == ""
		}
	}
	return false
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

// peerOf returns the peer that hclog key/value args name, if any: the
// keys hashicorp/raft v1.8.0 gives the other end of an RPC whose failure
// it logs once per attempt. "peer" (a raft.Server, named by its id, or
// an address): "failed to heartbeat to", "failed to appendEntries to",
// "failed to send snapshot to", "failed to install snapshot", "failed
// to start pipeline replication to", "failed to pipeline
// appendEntries", "appendEntries rejected, sending older logs";
// "server-id": "failed to contact"; "target" (a raft.Server): "failed
// to make requestVote RPC" (a candidate's, every election round).
// Messages that name no peer (a store's error, a connection's) are not
// limited: distinct failures of the node itself would be merged.
func peerOf(args []any) (string, bool) {
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "peer", "server-id", "target":
			if srv, ok := args[i+1].(raft.Server); ok {
				// By its id: a voter demoted is the same peer.
				return string(srv.ID), true
			}
			return fmt.Sprint(args[i+1]), true
		}
	}
	return "", false
}

// repeatWindow is how often a warning or an error about one peer is
// logged while raft keeps repeating it. Longer than raft's longest retry
// backoff (an AppendEntries to a failing peer backs off to about 10 s,
// a heartbeat to half the heartbeat timeout), so a peer down for good
// gives each message a line per window, not per attempt: an hour is about
// 120 lines per message and peer, not thousands. Short enough that the
// log says within half a minute that the failure continues, with raft's
// latest error. A constant, as the package's other log paces are
// (refusedLogEvery): nobody tunes it, and the transport's logger is made
// before any Options.
//
// The first line of a failure is raft's, at raft's level: an ERROR, so
// an operator who pages on errors hears that a peer went away. The lines
// after it, one per window while the failure lasts, say how many
// attempts failed unlogged since the last line (suppressed,
// suppressed_since) and are warnings: the same failure, one page is
// enough, and the ongoing state is the metrics' to alert on
// (dhtkv_maplog_unreachable_peers on the leader; on the data path,
// dhtkv_peer_silent and dhtkv_replica_failures_total by peer). A failure
// that stops for a window and comes back is a new one: its first line is
// raft's again. The count of a failure's last window goes untold when it
// ends within it (nothing logs after the last attempt).
const repeatWindow = 30 * time.Second

// repeatMaxKeys bounds the (message, peer) pairs the limiter remembers: a
// map log's peers are its members, at most a few hundred, each with a few
// messages. Beyond it, once none has been quiet for a window, the pairs
// not remembered share one more entry (the zero repeatKey), so that a
// flood of new peers is limited too, as one.
const repeatMaxKeys = 1024

// repeatKey is a line's logger name, message and peer.
type repeatKey struct{ name, msg, peer string }

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
	return &slogger{l: s.l, name: s.name, args: append(append([]any{}, s.args...), args...), rep: s.rep}
}
func (s *slogger) Name() string { return s.name }
func (s *slogger) Named(name string) hclog.Logger {
	n := name
	if s.name != "" {
		n = s.name + "." + name
	}
	return &slogger{l: s.l.With("subsystem", n), name: n, args: s.args, rep: s.rep}
}
func (s *slogger) ResetNamed(name string) hclog.Logger {
	return &slogger{l: s.l.With("subsystem", name), name: name, args: s.args, rep: s.rep}
}
func (s *slogger) SetLevel(hclog.Level)  {}
func (s *slogger) GetLevel() hclog.Level { return hclog.Debug }
func (s *slogger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(s.l.Handler(), slog.LevelDebug)
}
func (s *slogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slog.NewLogLogger(s.l.Handler(), slog.LevelDebug).Writer()
}
