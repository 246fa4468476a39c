package maplog

import (
	"io"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The log, the vote and the snapshots survive a close and a reopen of a
// real directory, and read back as written.
func TestStorePersists(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(vfs.Default, dir, 2, 1<<20, quiet)
	require.NoError(t, err)
	first, err := st.FirstIndex()
	require.NoError(t, err)
	require.Zero(t, first, "an empty log")
	var l raft.Log
	require.ErrorIs(t, st.GetLog(1, &l), raft.ErrLogNotFound)

	at := time.Unix(1700000000, 123)
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1 + i/5, Type: raft.LogCommand, Data: []byte{byte(i)}, AppendedAt: at})
	}
	logs[3].Data, logs[4].Extensions = nil, []byte("ext")
	require.NoError(t, st.StoreLogs(logs[:9]))
	require.NoError(t, st.StoreLog(logs[9]))
	require.NoError(t, st.DeleteRange(1, 2))
	require.NoError(t, st.SetUint64([]byte("CurrentTerm"), 7))
	require.NoError(t, st.Set([]byte("LastVoteCand"), []byte("node-1")))
	v, err := st.Get([]byte("absent"))
	require.NoError(t, err)
	require.Empty(t, v, "raft reads an absent key as empty")

	sink, err := st.Create(1, 9, 2, raft.Configuration{Servers: []raft.Server{{ID: "0", Address: "a"}}}, 3, nil)
	require.NoError(t, err)
	_, err = sink.Write([]byte("state"))
	require.NoError(t, err)
	require.NoError(t, sink.Close())
	require.NoError(t, st.Close())

	st, err = OpenStore(vfs.Default, dir, 2, 1<<20, quiet)
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	first, err = st.FirstIndex()
	require.NoError(t, err)
	last, err := st.LastIndex()
	require.NoError(t, err)
	require.Equal(t, []uint64{3, 10}, []uint64{first, last})
	for _, want := range logs[2:] {
		var got raft.Log
		require.NoError(t, st.GetLog(want.Index, &got))
		require.Equal(t, *want, got)
	}
	term, err := st.GetUint64([]byte("CurrentTerm"))
	require.NoError(t, err)
	require.Equal(t, uint64(7), term)
	v, err = st.Get([]byte("LastVoteCand"))
	require.NoError(t, err)
	require.Equal(t, "node-1", string(v))

	metas, err := st.List()
	require.NoError(t, err)
	require.Len(t, metas, 1)
	require.Equal(t, uint64(9), metas[0].Index)
	require.Equal(t, uint64(3), metas[0].ConfigurationIndex)
	meta, rc, err := st.Open(metas[0].ID)
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	require.Equal(t, "state", string(b))
	require.Equal(t, int64(5), meta.Size)
}

// Snapshots: the newest retain are kept, a cancelled one leaves nothing,
// and one over the size bound is refused.
func TestStoreSnapshots(t *testing.T) {
	st, err := OpenStore(vfs.NewMem(), "log", 2, 16, quiet)
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	put := func(index uint64, data string) error {
		sink, err := st.Create(1, index, 1, raft.Configuration{}, 1, nil)
		require.NoError(t, err)
		if _, err := sink.Write([]byte(data)); err != nil {
			require.NoError(t, sink.Cancel())
			return err
		}
		return sink.Close()
	}
	for i := uint64(1); i <= 4; i++ {
		require.NoError(t, put(i*10, "s"))
	}
	require.Error(t, put(50, "more than sixteen bytes"))
	sink, err := st.Create(1, 60, 1, raft.Configuration{}, 1, nil)
	require.NoError(t, err)
	require.NoError(t, sink.Cancel())
	metas, err := st.List()
	require.NoError(t, err)
	var idx []uint64
	for _, m := range metas {
		idx = append(idx, m.Index)
	}
	require.Equal(t, []uint64{40, 30}, idx, "newest first, two retained")
	_, _, err = st.Open("10-1")
	require.Error(t, err, "pruned")
}
