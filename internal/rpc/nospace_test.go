package rpc

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/store"
)

// A replica whose data volume is below --min-free-space answers each
// write of a batch with ResNoSpace and its reason, and serves the reads
// of the same batch; its caller gets an error that is
// store.ErrInsufficientStorage (not a refusal for good: the write is worth
// a hint). Once the volume has room again it takes writes.
func TestServeBatchNoSpace(t *testing.T) {
	var free atomic.Uint64
	free.Store(500 << 20)
	st, err := store.Open("/db", store.Options{
		FS: vfs.NewMem(), MinFreeSpace: sizeflag.Amount{Percent: 10}, SpaceCheckInterval: time.Nanosecond,
		StatFS: func(string) (vfs.DiskUsage, error) {
			return vfs.DiskUsage{AvailBytes: free.Load(), TotalBytes: 1000 << 20}, nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	defer st.Close()
	clock, err := hlc.New(2, time.Now)
	require.NoError(t, err)
	d := &Direct{URL: "http://replica", Server: &Server{
		Replica: &replica.Replica{Store: st, Clock: clock}, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20,
		Log: slog.New(slog.DiscardHandler),
	}}
	v1 := hlc.VersionAt(time.Now()) | 1
	_, err = d.Apply([]byte("a"), (&record.Record{Version: v1, Value: []byte("before")}).Encode(), 0, time.Time{})
	require.NoError(t, err)

	free.Store(10 << 20)
	body := AppendBatchOp(nil, OpWrite, []byte("b"), (&record.Record{Version: v1 + 256, Value: []byte("refused")}).Encode())
	body = AppendBatchOp(body, OpRead, []byte("a"), nil)
	answer, err := d.Server.ServeBatch(body, nil, false)
	require.NoError(t, err)
	r, rest, err := nextResult(answer)
	require.NoError(t, err)
	require.Equal(t, byte(ResNoSpace), r.code)
	require.Contains(t, r.msg, "insufficient storage: the data volume has 10 MiB free of 1000 MiB, below --min-free-space 10%")
	r, _, err = nextResult(rest)
	require.NoError(t, err)
	require.Equal(t, byte(ResFound), r.code, "the batch's read is served")

	_, err = d.Apply([]byte("b"), (&record.Record{Version: v1 + 512, Value: []byte("refused")}).Encode(), 0, time.Time{})
	require.ErrorIs(t, err, store.ErrInsufficientStorage)
	require.False(t, IsRefused(err), "not refused for good: worth a hint")
	rec, found, err := d.Get([]byte("a"), 0, time.Time{})
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "before", string(rec.Value))
	_, found, err = d.Get([]byte("b"), 0, time.Time{})
	require.NoError(t, err)
	require.False(t, found, "nothing of a refused write is stored")

	free.Store(200 << 20)
	_, err = d.Apply([]byte("b"), (&record.Record{Version: v1 + 768, Value: []byte("after")}).Encode(), 0, time.Time{})
	require.NoError(t, err)
}
