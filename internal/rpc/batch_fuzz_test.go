package rpc

import (
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// FuzzServeBatch feeds arbitrary bodies to a replica's batch handler on
// real Pebble (in memory) and checks what BatchPath promises whatever a
// peer sends:
//
//   - a body ParseBatch refuses is refused as a whole with 400, and so is
//     one with an empty key, an envelope, a version or an expiry (more
//     than record.MaxTTL after its version's time) out of bounds; a key
//     or a value over this node's limits is refused alone (a write's
//     ResRefused, a read's ResError);
//   - a refused batch stores nothing: every key it names reads as before;
//   - an accepted batch is answered with one well-formed result per
//     operation, of a code its kind may have, and nothing after them;
//   - a write answered applied reads back at its version or a newer one,
//     and a read answered found carries an envelope that decodes.
//
// The store and its contents live across inputs, so that later batches
// meet keys earlier ones wrote (newer versions, tombstones, expiry).
func FuzzServeBatch(f *testing.F) {
	now := hlc.VersionAt(time.Now())
	enc := func(r record.Record) []byte { return r.Encode() }
	seeds := [][]byte{
		nil,
		AppendBatchOp(nil, OpRead, []byte("a"), nil),
		AppendBatchOp(AppendBatchOp(nil, OpWrite, []byte("a"), enc(record.Record{Version: now, Value: []byte("v")})),
			OpRead, []byte("a"), nil),
		AppendBatchOp(nil, OpWrite, []byte("b"), enc(record.Record{Version: now + 1, Tombstone: true})),
		AppendBatchOp(nil, OpWrite, []byte("c"), enc(record.Record{Version: now + 2, ExpiresAt: 1, Value: []byte("x")})),
		AppendBatchOp(nil, OpWrite, []byte("d"), enc(record.Record{Version: ^uint64(0), Value: []byte("far ahead")})),
		AppendBatchOp(nil, OpWrite, []byte("e"), enc(record.Record{Version: 0, Value: []byte("version 0")})),
		AppendBatchOp(nil, OpWrite, []byte("g"), enc(record.Record{Version: now + 4, ExpiresAt: ^uint64(0), Value: []byte("x")})),
		AppendBatchOp(nil, OpWrite, []byte("h"), enc(record.Record{Version: now + 5, ExpiresAt: 1<<63 - 1, Value: []byte("x")})),
		AppendBatchOp(nil, OpWrite, []byte("i"), enc(record.Record{Version: now + 6, Value: []byte("x"),
			ExpiresAt: uint64(hlc.TimeOf(now + 6).Add(record.MaxTTL).UnixMilli())})),
		AppendBatchOp(nil, OpWrite, []byte("too long a key"), enc(record.Record{Version: now, Value: []byte("v")})),
		AppendBatchOp(nil, OpWrite, []byte("f"), enc(record.Record{Version: now, Value: make([]byte, 40)})),
		[]byte("g\xff\xff\xff"),
		[]byte("w\x01k\x02ab"),
	}
	// Writes and then reads of values at the limit: the answer reaches
	// MaxAnswerBytes, and the last reads are left for another batch.
	var full []byte
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"} {
		full = AppendBatchOp(full, OpWrite, []byte(k), enc(record.Record{Version: now + 3, Value: make([]byte, 32)}))
	}
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"} {
		full = AppendBatchOp(full, OpRead, []byte(k), nil)
	}
	seeds = append(seeds, full)
	for _, s := range seeds {
		f.Add(s)
	}

	st, err := store.Open("/db", store.Options{FS: vfs.NewMem(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(f, err)
	f.Cleanup(func() { st.Close() })
	clock, err := hlc.New(2, time.Now)
	require.NoError(f, err)
	rc, err := cache.New(1 << 20)
	require.NoError(f, err)
	f.Cleanup(rc.Close)
	const maxKey, maxValue = 8, 32
	s := &Server{
		Replica:     &replica.Replica{Store: st, Clock: clock, Cache: rc},
		MaxKeyBytes: maxKey, MaxValueBytes: maxValue, MaxAnswerBytes: 256,
		Log: slog.New(slog.DiscardHandler),
	}
	read := func(t *testing.T, key []byte) cache.Entry {
		e, err := s.Replica.Get(key)
		require.NoError(t, err)
		return e
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		ops, parseErr := ParseBatch(body, nil)
		// What every key the batch names holds before it, when it can
		// be read at all (a key out of the limits never reaches the store).
		before := make(map[string]cache.Entry)
		for _, op := range ops {
			if len(op.Key) > 0 && len(op.Key) <= maxKey {
				before[string(op.Key)] = read(t, op.Key)
			}
		}
		// The handler may alias the body; give it a copy it may not keep.
		in := append([]byte(nil), body...)
		answer, err := s.ServeBatch(in, nil, false)
		clear(in)
		if err != nil {
			var refused *Error
			require.True(t, errors.As(err, &refused), "a batch is refused with an *Error, got %v", err)
			require.True(t, refused.Status >= 400 && refused.Status < 500, "status %d", refused.Status)
			require.NotEmpty(t, refused.Msg)
			if parseErr != nil {
				require.Equal(t, http.StatusBadRequest, refused.Status)
			}
			for k, e := range before {
				require.Equal(t, e, read(t, []byte(k)), "key %q changed by a refused batch", k)
			}
			return
		}
		require.NoError(t, parseErr, "a batch ParseBatch refuses was served")
		over := make([]bool, len(ops)) // over this node's limits: refused alone
		for i, op := range ops {
			require.NotEmpty(t, op.Key, "operation %d's empty key was served", i)
			over[i] = len(op.Key) > maxKey
			if op.Kind == OpWrite {
				rec, err := record.Decode(op.Envelope)
				require.NoError(t, err, "operation %d's envelope was served", i)
				require.NotZero(t, rec.Version, "operation %d's version 0 was served", i)
				over[i] = over[i] || len(rec.Value) > maxValue
				if rec.ExpiresAt != 0 {
					require.False(t, hlc.TimeOf(rec.Version).Add(record.MaxTTL).Before(time.UnixMilli(int64(rec.ExpiresAt))),
						"operation %d's expiry %d, beyond its version's time and MaxTTL, was served", i, rec.ExpiresAt)
				}
			}
		}
		rest := answer
		for i, op := range ops {
			var r batchResult
			r, rest, err = nextResult(rest)
			require.NoError(t, err, "result %d of %d", i, len(ops))
			if over[i] {
				want := byte(ResRefused)
				if op.Kind == OpRead {
					want = ResError
				}
				require.Equal(t, want, r.code, "operation %d over the limits", i)
				if e, ok := before[string(op.Key)]; ok && !slices.ContainsFunc(ops, func(o BatchOp) bool {
					return o.Kind == OpWrite && string(o.Key) == string(op.Key)
				}) {
					require.Equal(t, e, read(t, op.Key), "key %q changed by a refused operation", op.Key)
				}
				continue
			}
			if op.Kind == OpRead {
				require.Contains(t, []byte{ResFound, ResNotFound, ResOverLimit, ResError}, r.code, "read %d", i)
				if r.code == ResFound {
					_, err := record.Decode(r.envelope)
					require.NoError(t, err, "read %d's envelope", i)
				}
				continue
			}
			require.Contains(t, []byte{ResApplied, ResNewer, ResError, ResRefused, ResNoSpace}, r.code, "write %d", i)
			if r.code == ResApplied {
				sent, err := record.Decode(op.Envelope)
				require.NoError(t, err)
				got := read(t, op.Key)
				require.True(t, got.Found, "write %d applied and not found", i)
				require.GreaterOrEqual(t, got.Rec.Version, sent.Version, "write %d", i)
			}
		}
		require.Empty(t, rest, "bytes after the last result")
	})
}
