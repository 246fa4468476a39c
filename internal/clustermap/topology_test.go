package clustermap

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
)

func TestParseTopology(t *testing.T) {
	tests := []struct {
		name, list, self string
		want             Topology
	}{
		{"single node without --cluster", "", "http://127.0.0.1:8080",
			Topology{Nodes: []string{"http://127.0.0.1:8080"}, Self: 0}},
		{"self found by position", "http://127.0.0.1:8080,http://127.0.0.1:8081,http://127.0.0.1:8082", "http://127.0.0.1:8081",
			Topology{Nodes: []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"}, Self: 1}},
		{"spaces, trailing slash and empty items are normalized", " http://127.0.0.1:8080/ , ,http://127.0.0.1:8081,", "http://127.0.0.1:8081/",
			Topology{Nodes: []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081"}, Self: 1}},
		{"host names are kept", "http://a:1,http://b:2", "http://b:2",
			Topology{Nodes: []string{"http://a:1", "http://b:2"}, Self: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTopology(tt.list, tt.self)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, len(tt.want.Nodes), got.Size())
		})
	}
}

func TestParseTopologyErrors(t *testing.T) {
	tests := []struct{ name, list, self, errPart string }{
		{"self not in list", "http://127.0.0.1:8080,http://127.0.0.1:8081", "http://127.0.0.1:9999", "not in --cluster"},
		{"duplicate", "http://127.0.0.1:8080,http://127.0.0.1:8080/", "http://127.0.0.1:8080", "listed twice"},
		{"https", "https://127.0.0.1:8080", "https://127.0.0.1:8080", "also under TLS"},
		{"https member", "http://127.0.0.1:8080,https://127.0.0.1:8081", "http://127.0.0.1:8080", "--cluster: bad node URL \"https://127.0.0.1:8081\": want http://host:port, also under TLS"},
		{"no port", "http://127.0.0.1", "http://127.0.0.1:8080", "--cluster"},
		{"path", "http://127.0.0.1:8080/v0", "http://127.0.0.1:8080", "--cluster"},
		{"query", "http://127.0.0.1:8080?x=1", "http://127.0.0.1:8080", "--cluster"},
		{"bare host:port", "127.0.0.1:8080", "http://127.0.0.1:8080", "--cluster"},
		{"bad self", "http://127.0.0.1:8080", "::", "--self"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTopology(tt.list, tt.self)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.errPart)
		})
	}
}

// Node ids are HLC tie-breaks: the list cannot be longer than the ids a
// version can carry.
func TestParseTopologyTooManyNodes(t *testing.T) {
	urls := nodeURLs(10000, hlc.MaxNodeID+1)
	_, err := ParseTopology(strings.Join(urls, ","), urls[0])
	require.NoError(t, err)
	urls = nodeURLs(10000, hlc.MaxNodeID+2)
	_, err = ParseTopology(strings.Join(urls, ","), urls[0])
	require.ErrorContains(t, err, "at most")
}

// nodeURLs returns n distinct node URLs in the form the topology keeps.
func nodeURLs(base, n int) []string {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(base+i)
	}
	return urls
}
