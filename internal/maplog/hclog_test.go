package maplog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
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
