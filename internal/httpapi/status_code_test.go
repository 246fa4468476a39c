package httpapi

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/probe"
)

// TestReplicaStatusClock: a write refused for a clock, this node's (off,
// or not verified) or the one that made a replica's version, is a 503
// with the coordinator's reason, never a 500; one refused because too few
// peers answered to verify the clock is a 504.
func TestReplicaStatusClock(t *testing.T) {
	s := &Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, base := range []error{probe.ErrClockSkew, probe.ErrClockUnverified, cluster.ErrReplicaAhead} {
		err := fmt.Errorf("write: %w: why", base)
		code, reason := s.replicaStatus([]byte("/v0/entity"), err)
		require.Equal(t, fasthttp.StatusServiceUnavailable, code, "%v", base)
		require.Equal(t, err.Error(), reason)
	}
	err := fmt.Errorf("write: %w: %w: why", probe.ErrClockUnverified, probe.ErrTooFewPeers)
	code, reason := s.replicaStatus([]byte("/v0/entity"), err)
	require.Equal(t, fasthttp.StatusGatewayTimeout, code, "too few peers answered to verify the clock")
	require.Equal(t, err.Error(), reason)
	code, reason = s.replicaStatus([]byte("/v0/entity"), errors.New("disk on fire"))
	require.Equal(t, fasthttp.StatusInternalServerError, code)
	require.Equal(t, "internal error", reason)
}
