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
		{"a warning stays one", func(l hclog.Logger) { l.Warn("heartbeat timeout reached", "last-leader-addr", "x") }, "level=WARN"},
		{"raft's info is the node's debug", func(l hclog.Logger) { l.Info("entering follower state") }, ""},
		{"a connection closed here is no error", func(l hclog.Logger) {
			l.Error("failed to decode incoming command", "error", closed)
		}, ""},
		{"nor a warning", func(l hclog.Logger) { l.Warn("failed to accept connection", "error", closed) }, ""},
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

// repeats logs the first line of a (message, peer) at once, then one per
// repeatWindow while it repeats, with how many were not logged since the
// last; a line after a window of quiet starts afresh. The clock is a
// fake one: each step advances it by its after.
func TestRepeats(t *testing.T) {
	hb := repeatKey{msg: "failed to heartbeat to", peer: "10.0.0.2:7000"}
	hb3 := repeatKey{msg: "failed to heartbeat to", peer: "10.0.0.3:7000"}
	ae := repeatKey{msg: "failed to appendEntries to", peer: "2"}
	type step struct {
		after time.Duration // the clock advances by it first
		key   repeatKey
		want  verdict
	}
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	logged := verdict{log: true}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the first is logged", []step{{0, hb, logged}}},
		{"repeats within the window are not", []step{
			{0, hb, logged}, {time.Second, hb, verdict{}}, {28 * time.Second, hb, verdict{}},
		}},
		{"the window passed: one line with the count", []step{
			{0, hb, logged}, {10 * time.Second, hb, verdict{}}, {10 * time.Second, hb, verdict{}},
			{10 * time.Second, hb, verdict{log: true, suppressed: 2, since: at(0)}},
			{10 * time.Second, hb, verdict{}},
			{20 * time.Second, hb, verdict{log: true, suppressed: 1, since: at(30 * time.Second)}},
		}},
		{"a peer of its own, a message of its own", []step{
			{0, hb, logged}, {0, hb3, logged}, {0, ae, logged}, {time.Second, hb, verdict{}},
			{0, hb3, verdict{}}, {0, ae, verdict{}},
		}},
		{"quiet for a window: a new failure, its first line raft's", []step{
			{0, hb, logged}, {time.Second, hb, verdict{}}, {repeatWindow, hb, logged}, {time.Second, hb, verdict{}},
		}},
		{"a line every window is logged, each a first", []step{
			{0, hb, logged}, {repeatWindow, hb, logged}, {repeatWindow, hb, logged},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			r := newRepeats(func() time.Time { return now })
			for i, s := range tc.steps {
				now = now.Add(s.after)
				assert.Equal(t, s.want, r.note(s.key), "step %d at %v", i, now.Sub(t0))
			}
		})
	}
}

// repeats remembers at most repeatMaxKeys pairs and one shared entry for
// the others: those quiet for a window are forgotten first, and the
// pairs beyond are limited as one.
func TestRepeatsBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := newRepeats(func() time.Time { return now })
	key := func(i int) repeatKey { return repeatKey{msg: "failed to heartbeat to", peer: strconv.Itoa(i)} }
	for i := range repeatMaxKeys {
		require.True(t, r.note(key(i)).log)
	}
	require.True(t, r.note(key(repeatMaxKeys)).log, "the first beyond the bound: the shared entry's first")
	require.False(t, r.note(key(repeatMaxKeys+1)).log, "the next shares its window")
	require.False(t, r.note(key(0)).log, "a remembered pair keeps its own")
	require.Len(t, r.keys, repeatMaxKeys+1)

	now = now.Add(repeatWindow)
	require.True(t, r.note(key(repeatMaxKeys+2)).log, "the quiet ones are forgotten for it")
	require.LessOrEqual(t, len(r.keys), repeatMaxKeys+1)
	for i := range 3 * repeatMaxKeys {
		now = now.Add(time.Millisecond)
		r.note(key(i))
	}
	require.LessOrEqual(t, len(r.keys), repeatMaxKeys+1)
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
	var b syncBuffer
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
