package cluster

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// noStreams opens an empty stream of every node.
type noStreams struct{}

func (noStreams) Open(context.Context, string, uint64, []byte, []byte) (scan.Iterator, error) {
	return emptyIter{}, nil
}

type emptyIter struct{}

func (emptyIter) Next() bool                { return false }
func (emptyIter) Key() []byte               { return nil }
func (emptyIter) Envelope() []byte          { return nil }
func (emptyIter) Record() (r record.Record) { return r }
func (emptyIter) Err() error                { return nil }
func (emptyIter) Close() error              { return nil }

// TestNotAMemberRefuses: a node whose id the map gave to a machine at
// another address (a replace; a decommission or a removal alike) routes
// by a view in which it is no node (Self -1) until it stops. Its GET, PUT
// and cluster scan are refused with ErrNotAMember. A GET or PUT used to
// dereference the transport the view has for no node (the id's is the
// replacement's, which the view leaves out as this node's own): the
// process crashed; a scan read its own store in node 0's place, racing
// node 0's stream for the same slot and counting it as node 0's answer.
func TestNotAMemberRefuses(t *testing.T) {
	clock, err := hlc.New(0, nil)
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	defer st.Close()
	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1"}, 0)
	require.NoError(t, err)
	v := view.New(m, 0, "http://old:1", func(string) view.Peer { return newerPeer{1} }, time.Now())
	require.Equal(t, -1, v.Self, "node 0's id is another machine's now")
	c := New(Deps{
		Views: func() *view.View { return v }, Gate: openGate{}, Clock: clock, Streams: noStreams{},
		Local: &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)},
	}, Options{Timeout: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()

	_, err = c.Get([]byte("k"), 2, 3)
	require.ErrorIs(t, err, ErrNotAMember)
	require.ErrorIs(t, c.Write([]byte("k"), []byte("v"), false, 0, 2, 3), ErrNotAMember)
	_, err = c.Scan(context.Background(), nil, nil, 1, 3)
	require.ErrorIs(t, err, ErrNotAMember)
}
