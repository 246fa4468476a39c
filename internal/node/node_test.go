package node_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// The node's registry says which build runs: dhtkv_build_info is 1 with
// the version and Go release as labels.
func TestBuildInfoMetric(t *testing.T) {
	c, _ := testcluster.Single(t)
	n := c.Node(0)
	require.Equal(t, 1.0, testcluster.Metric(t, n.Registry(), "dhtkv_build_info",
		"version", buildinfo.Version(), "goversion", buildinfo.GoVersion()))
}
