package maplog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dhtkv/dhtkv/internal/logbuf"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHCLogLevels(t *testing.T) {
	closed := &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("poll: %w", net.ErrClosed)}
	for _, tc := range []struct {
		name   string
		log    func(hclog.Logger)
		logged string // what the node's log shows at level info; "" nothing
	}{
		{"an error stays one", func(l hclog.Logger) {
			l.Error("failed to decode incoming command", "error", errors.New("unexpected EOF"))
		}, "level=ERROR"},
		{"a warning stays one", func(l hclog.Logger) {
			l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "x:1", "last-leader-id", "2")
		}, "level=WARN"},
		{"the election of a start is no warning", func(l hclog.Logger) {
			l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
		}, "level=INFO"},
		{"raft's info is the node's debug", func(l hclog.Logger) { l.Info("entering follower state") }, ""},
		{"a connection closed here is no error", func(l hclog.Logger) {
			l.Error("failed to decode incoming command", "error", closed)
		}, ""},
		{"nor a warning", func(l hclog.Logger) { l.Warn("failed to accept connection", "error", closed) }, ""},
		{"hclog.Fmt is formatted", func(l hclog.Logger) {
			l.Warn("initial configuration", "servers", hclog.Fmt("%+v", []raft.Server{{ID: "1", Address: "a:1"}}))
		}, `servers="[{Suffrage:Voter ID:1 Address:a:1}]"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.log(newHCLog(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo}))).Named("raft-net"))
			if tc.logged == "" {
				assert.Empty(t, b.String())
				return
			}
			assert.Contains(t, b.String(), tc.logged)
			assert.Contains(t, b.String(), "component=maplog.raft")
		})
	}
}

// The adapter, fed what hashicorp/raft's leader logs while a follower is
// down (replication.go: a failed heartbeat every ~0.5 s with the peer's
// address, a failed AppendEntries with the raft.Server, demoted midway),
// logs one error per message and peer, then a warning per window with
// the count; lines that name no peer, and raft's debug, are not limited.
func TestHCLogRepeatedPeerFailures(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var b bytes.Buffer
	l := newHCLogClock(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})),
		func() time.Time { return now }).Named("raft")
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	down := raft.Server{Suffrage: raft.Voter, ID: "2", Address: "10.0.0.2:7000"}
	const step = 600 * time.Millisecond
	for i := range int(65 * time.Second / step) { // 108 attempts over 65 s
		if i == 10 {
			down.Suffrage = raft.Nonvoter // demoted: the same peer
		}
		l.Error("failed to heartbeat to", "peer", down.Address, "backoff time", 500*time.Millisecond, "error", refused)
		l.Error("failed to appendEntries to", "peer", down, "error", refused)
		l.Debug("failed to contact", "server-id", down.ID, "time", time.Duration(i)*step)
		if i == 50 { // another peer goes down at 30 s
			l.Error("failed to heartbeat to", "peer", raft.ServerAddress("10.0.0.3:7000"), "backoff time", 10*time.Millisecond, "error", refused)
		}
		now = now.Add(step)
	}
	for range 3 {
		l.Error("failed to get log", "index", 7, "error", errors.New("disk"))
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	count := func(subs ...string) int {
		n := 0
	line:
		for _, ln := range lines {
			for _, s := range subs {
				if !strings.Contains(ln, s) {
					continue line
				}
			}
			n++
		}
		return n
	}
	hb := `msg="failed to heartbeat to"`
	// Attempts at 0, 0.6, ... 64.2 s: logged at 0, 30 (49 not since) and 60 s (49).
	assert.Equal(t, 3, count(hb, "peer=10.0.0.2:7000"), b.String())
	assert.Equal(t, 1, count("level=ERROR", hb, "peer=10.0.0.2:7000"))
	assert.Equal(t, 2, count("level=WARN", hb, "peer=10.0.0.2:7000", "suppressed=49 suppressed_since="))
	assert.Equal(t, 3, count(`msg="failed to appendEntries to"`))
	assert.Equal(t, 1, count("level=ERROR", `msg="failed to appendEntries to"`), "a demotion is no new peer")
	assert.Equal(t, 1, count("level=ERROR", "peer=10.0.0.3:7000"))
	assert.Equal(t, 108, count(`msg="failed to contact"`, "level=DEBUG"), "raft's debug: every line")
	assert.Equal(t, 3, count(`msg="failed to get log"`), "no peer: every line")
	assert.Equal(t, 3+3+1+108+3, len(lines))
	assert.Equal(t, 3+3+1+108+3, count("component=maplog.raft", "subsystem=raft"))
}

// The adapter is safe for concurrent use: raft logs from a goroutine per
// follower.
func TestHCLogRepeatsConcurrent(t *testing.T) {
	var b logbuf.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&b, nil)))
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for range 200 {
				l.Error("failed to heartbeat to", "peer", raft.ServerAddress(fmt.Sprintf("10.0.0.%d:7000", p)), "error", errors.New("refused"))
				l.With("k", "v").Named("x").Warn("failed to contact", "server-id", raft.ServerID(strconv.Itoa(p)))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 8, strings.Count(b.String(), "\n"), "one line per message and peer")
}

// A single node's start, as the node logs it at level info: one component
// per line, and no warning for the election every start holds.
func TestStartLogsNoWarning(t *testing.T) {
	var b logbuf.Buffer
	_, trans := raft.NewInmemTransport("node0")
	l, err := Open(vfs.NewMem(), "log", 0, trans, nil, fastOptions(),
		slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})))
	require.NoError(t, err)
	require.NoError(t, l.Start())
	require.NoError(t, l.Bootstrap([]Server{{ID: 0, Addr: "node0"}}))
	require.Eventually(t, l.IsLeader, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, l.Close())
	out := b.String()
	assert.Contains(t, out, "starting election")
	for line := range strings.Lines(out) {
		assert.Equal(t, 1, strings.Count(line, "component="), line)
		assert.NotContains(t, line, "level=WARN")
	}
}
