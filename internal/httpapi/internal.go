package httpapi

import (
	"crypto/subtle"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

// checkSecret answers 403 and returns false when --cluster-secret is set and
// the request does not carry it.
func (s *Server) checkSecret(ctx *fasthttp.RequestCtx) bool {
	if s.Secret == "" {
		return true
	}
	got := ctx.Request.Header.Peek(cluster.SecretHeader)
	if subtle.ConstantTimeCompare(got, []byte(s.Secret)) != 1 {
		ctx.Error("forbidden: missing or wrong cluster secret\n", fasthttp.StatusForbidden)
		return false
	}
	return true
}

// batchScratch is the per-request working memory of internalBatch, pooled.
type batchScratch struct {
	ops    []cluster.BatchOp
	recs   []record.Record
	writes []store.Write
	newer  []uint64 // per operation: the newer version that refuses a write
	out    []byte
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

// release returns sc to the pool, dropping its references into the request
// (keys, envelopes) and a large answer buffer.
func (sc *batchScratch) release() {
	clear(sc.ops)
	clear(sc.recs)
	clear(sc.writes)
	if cap(sc.out) > 1<<20 {
		sc.out = nil
	}
	batchScratches.Put(sc)
}

// internalBatch serves a batch of replica reads and writes from another
// node's coordinator (see cluster.BatchPath) against the local replica
// only. Writes carry the version the coordinator assigned; last-write-wins
// in the store keeps the newest, and all the batch's accepted writes go to
// the store in one commit (one fsync).
func (s *Server) internalBatch(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if !s.checkSecret(ctx) {
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer sc.release()
	var err error
	if sc.ops, err = cluster.ParseBatch(ctx.PostBody(), sc.ops[:0]); err != nil {
		fail(ctx, badRequest("%v", err))
		return
	}
	// Validate everything before touching anything: a malformed batch is
	// refused whole.
	sc.recs, sc.newer = sc.recs[:0], sc.newer[:0]
	var maxVersion uint64
	for i, op := range sc.ops {
		if len(op.Key) == 0 || len(op.Key) > s.Limits.MaxKeyBytes {
			fail(ctx, badRequest("operation %d: key of %d bytes (1 to %d allowed)", i, len(op.Key), s.Limits.MaxKeyBytes))
			return
		}
		var rec record.Record
		if op.Kind == cluster.OpWrite {
			if rec, err = record.Decode(op.Envelope); err != nil || rec.Version == 0 {
				fail(ctx, badRequest("operation %d: bad record envelope", i))
				return
			}
			if err := s.Clock.CheckAhead(rec.Version); err != nil {
				fail(ctx, badRequest("operation %d: %v", i, err))
				return
			}
			if len(rec.Value) > s.Limits.MaxValueBytes {
				fail(ctx, &apiError{fasthttp.StatusRequestEntityTooLarge, "value too large"})
				return
			}
			maxVersion = max(maxVersion, rec.Version)
		}
		sc.recs = append(sc.recs, rec)
		sc.newer = append(sc.newer, 0)
	}
	if maxVersion > 0 {
		if err := s.Clock.Observe(maxVersion); err != nil { // before storing any
			s.replicaError(ctx, err)
			return
		}
	}
	// A newer version already here means the coordinator's clock is behind
	// this key: refuse that write and report the version, so that the
	// coordinator can rewrite above it (see cluster.Coordinator.Write).
	// Equal is the same write repeated: apply.
	sc.writes = sc.writes[:0]
	for i, op := range sc.ops {
		if op.Kind != cluster.OpWrite {
			continue
		}
		newer, err := s.Local.NewerVersion(op.Key, sc.recs[i].Version)
		if err != nil {
			s.replicaError(ctx, err)
			return
		}
		if newer != 0 {
			sc.newer[i] = newer
			continue
		}
		sc.writes = append(sc.writes, store.Write{Key: op.Key, Rec: &sc.recs[i]})
	}
	var applyErr error
	if len(sc.writes) > 0 {
		applyErr = s.Local.ApplyBatch(sc.writes) // the store copies keys and values
		if applyErr != nil {
			s.Log.Error("internal batch", "writes", len(sc.writes), "err", applyErr)
		}
	}
	out := sc.out[:0]
	for i, op := range sc.ops {
		switch {
		case op.Kind == cluster.OpWrite && sc.newer[i] != 0:
			out = cluster.AppendResultNewer(out, sc.newer[i])
		case op.Kind == cluster.OpWrite && applyErr != nil:
			out = cluster.AppendResultError(out, "store write failed")
		case op.Kind == cluster.OpWrite:
			out = append(out, cluster.ResApplied)
		default:
			e, err := s.Local.Get(op.Key)
			switch {
			case err != nil:
				s.Log.Error("internal batch read", "err", err)
				out = cluster.AppendResultError(out, "store read failed")
			case !e.Found:
				out = append(out, cluster.ResNotFound)
			default:
				var hdr [record.HeaderSize]byte
				h := record.Record{Version: e.Rec.Version, Tombstone: e.Rec.Tombstone}
				out = cluster.AppendResultFound(out, h.AppendEncode(hdr[:0]), e.Rec.Value)
			}
		}
	}
	// The answer becomes the response's body without a copy; the response's
	// previous (empty) buffer is kept for the next batch.
	sc.out = ctx.Response.SwapBody(out)
}
