package rpc

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Server is the receiving side of node-to-node traffic: it serves other
// coordinators' batches, summaries, map exchanges and streams against this
// node's replica only. ServeBatch and ServeSummary know nothing of the
// transport (Direct calls them in-process); the HTTP side of each
// endpoint is handler.go's, which the node's HTTP server routes to.
type Server struct {
	// Replica stores the batches' writes by its one path for records of
	// other nodes (replica.ApplyRemote: the clock bound, observing,
	// last-write-wins, the horizon) and serves their reads.
	Replica *replica.Replica
	// MaxKeyBytes and MaxValueBytes are the node's own limits
	// (--max-key-bytes, --max-value-bytes): an operation beyond them is
	// refused like a public request would be, alone (its batch-mates are
	// other clients' calls, and the peers' limits may be larger).
	MaxKeyBytes, MaxValueBytes int
	// Secret, when set, must accompany every request (--cluster-secret).
	Secret string
	// RequirePeerCert makes the internal endpoints answer only requests
	// on a TLS connection whose client certificate the handshake verified
	// against --peer-tls-ca (mutual TLS: tlsconf.PeerVerified), in place
	// of the loopback-only rule; the secret, if set, is required as well.
	// The default value is false.
	RequirePeerCert bool
	// Rebuilding, when it returns true, makes reads fail: the replica is
	// still copying its share and would answer "never written" for keys
	// it has not copied yet (nil: never).
	Rebuilding func() bool
	// Incarnation names this process among the node's runs (0: not said):
	// the node draws it at random when it starts, and the answer to a
	// ping carries it (IncarnationHeader), so that peers can tell a
	// restart, after which the replica may hold other data (a backup
	// restored, a disk wiped), from a node that stayed up.
	Incarnation uint64
	// FormedAt returns when this node first saw every other node answer,
	// as its identity records it (store.Identity.FormedAt; zero: not
	// yet, or not known). nil: never said. See FormedAtHeader.
	FormedAt func() time.Time
	// Settings are this node's settings that every node of the cluster
	// must share, as "name=value" words (node.Config.SharedSettings;
	// "": not said). A ping's answer carries them (SettingsHeader), so
	// that a node can tell its operator which peer differs.
	Settings string
	// ClusterFormed reports whether this node has seen every other node
	// answer (nil: unknown); see FormedHeader.
	ClusterFormed func() bool
	// MaxAnswerBytes bounds a batch's answer (default DefaultMaxAnswerBytes):
	// reads beyond it are answered ResOverLimit, to be asked again, so a
	// small request of many reads of large values cannot make the node
	// build an answer of their sum. The first read is always answered,
	// whatever its size (up to --max-value-bytes).
	MaxAnswerBytes int
	// Maps gates batches by cluster-map epoch and serves MapPath (see
	// epoch.go); nil: no gate, no map.
	Maps Maps
	// StreamPace paces the partition streams this node sends (StreamPath
	// with parts: the copies of membership changes and rebuilds), in
	// bytes of keys and envelopes a second, so that a copy costs the
	// sender no more than its pace allows; range scans' streams are not
	// paced. nil: unpaced. The node gives it --move-rate, governed by its
	// background pace (package pace).
	StreamPace *rate.Limiter
	// LogConns takes the connections upgraded to the cluster map's log
	// (LogPath, upgrade.go); nil: the node runs without the log, and
	// LogPath answers 503.
	LogConns *LogListener
	// HoldAnswer, when set, makes a batch's or summary's answer of more
	// than 256 KiB the response body, charged to the node's budget of
	// answers being sent until its client has read it (httpapi's
	// --max-inflight-response-bytes), and reports false, setting
	// nothing, when the budget cannot take it: the request is then
	// answered 503. Without it such answers were held uncounted: clients
	// of the internal port that ask for large values and read nothing
	// made the node hold one answer per connection. nil: not charged.
	HoldAnswer func(ctx *fasthttp.RequestCtx, answer []byte) bool
	// Late counts the batches refused for arriving after their sender's
	// deadline (DeadlineHeader); nil: not counted.
	Late prometheus.Counter
	Log  *slog.Logger
}

// DefaultMaxAnswerBytes is Server.MaxAnswerBytes's default: 1 MiB.
const DefaultMaxAnswerBytes = 1 << 20

// Error refuses a whole request: nothing of it was stored. Status is the
// HTTP status the transport answers with, Msg a one-line reason.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refuse(status int, format string, args ...any) *Error {
	return &Error{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// Authorized reports whether a request carrying header value got in
// SecretHeader may be served. The comparison is constant-time.
func (s *Server) Authorized(got []byte) bool {
	return s.Secret == "" || subtle.ConstantTimeCompare(got, []byte(s.Secret)) == 1
}

// batchScratch is the per-request working memory of ServeBatch, pooled.
type batchScratch struct {
	ops      []BatchOp
	recs     []record.Record
	writes   []store.Write
	outcomes []replica.Outcome // per write, in operation order
	oversize []string          // per operation: why it is over this node's limits ("": it is not)
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

// release returns sc to the pool without its references into the request.
func (sc *batchScratch) release() {
	clear(sc.ops)
	clear(sc.recs)
	clear(sc.writes)
	clear(sc.outcomes)
	clear(sc.oversize)
	batchScratches.Put(sc)
}

// ServeBatch serves one batch (see BatchPath) and appends its answer to
// out. body may be the transport's buffer: nothing of it is kept after
// ServeBatch returns (the store copies keys and values into its batch).
// A background batch (BackgroundHeader) reads without filling the read
// cache (replica.GetUncached).
//
// Writes carry the version the coordinator assigned; last-write-wins in
// the store keeps the newest, and all the batch's accepted writes go to
// the store in one commit (one fsync). Every operation is validated before
// anything is applied, so a malformed batch (an *Error) stores nothing;
// an operation whose key or value is over this node's limits is refused
// alone (a write ResRefused, a read ResError).
// The replica's failures (the store, persisting the clock) fail only the
// operations they touch, each with its reason in the answer.
func (s *Server) ServeBatch(body, out []byte, background bool) ([]byte, error) {
	sc := batchScratches.Get().(*batchScratch)
	defer sc.release()
	var err error
	if sc.ops, err = ParseBatch(body, sc.ops[:0]); err != nil {
		return out, refuse(http.StatusBadRequest, "%v", err)
	}
	sc.recs = sc.recs[:0]
	sc.oversize = sc.oversize[:0]
	for i, op := range sc.ops {
		if len(op.Key) == 0 {
			return out, refuse(http.StatusBadRequest, "operation %d: key of 0 bytes (1 to %d allowed)", i, s.MaxKeyBytes)
		}
		var rec record.Record
		// A key or value over this node's limits is that operation's
		// refusal, not its batch's: the limits are each node's flags, and a
		// coordinator with larger ones batches other clients' calls with it.
		var over string
		if len(op.Key) > s.MaxKeyBytes {
			over = fmt.Sprintf("key of %d bytes (1 to %d allowed)", len(op.Key), s.MaxKeyBytes)
		}
		if op.Kind == OpWrite {
			if rec, err = record.Decode(op.Envelope); err != nil {
				return out, refuse(http.StatusBadRequest, "operation %d: bad record envelope: %v", i, err)
			}
			if rec.Version == 0 {
				return out, refuse(http.StatusBadRequest, "operation %d: bad record envelope: version 0", i)
			}
			if !expiryInBounds(&rec) {
				return out, refuse(http.StatusBadRequest, "operation %d: expiry %d ms is more than the longest ttl (%v) after its version's time, %d ms",
					i, rec.ExpiresAt, record.MaxTTL, hlc.TimeOf(rec.Version).UnixMilli())
			}
			if over == "" && len(rec.Value) > s.MaxValueBytes {
				over = fmt.Sprintf("value of %d bytes, limit is %d", len(rec.Value), s.MaxValueBytes)
			}
		}
		sc.recs = append(sc.recs, rec)
		sc.oversize = append(sc.oversize, over)
	}
	// A version too far ahead is its write's problem only (its
	// coordinator's clock), not the batch's: the other operations, other
	// clients' requests, go on. A newer version already here means the
	// coordinator's clock is behind this key: that write is refused with
	// the version, so that the coordinator can rewrite above it (see
	// cluster.Coordinator.Write). Both are replica.ApplyRemote's rules.
	sc.writes = sc.writes[:0]
	for i, op := range sc.ops {
		if op.Kind == OpWrite && sc.oversize[i] == "" {
			sc.writes = append(sc.writes, store.Write{Key: op.Key, Rec: &sc.recs[i]})
		}
	}
	var applyErr error
	noSpace := false
	if len(sc.writes) > 0 {
		sc.outcomes, applyErr = s.Replica.ApplyRemote(sc.writes, sc.outcomes)
		// A store that takes no writes now says so once, as its state
		// changes, not at every batch.
		noSpace = errors.Is(applyErr, store.ErrInsufficientStorage)
		if applyErr != nil && !noSpace {
			s.Log.Error("internal batch", "writes", len(sc.writes), "err", applyErr)
		}
	}
	start, readOne := len(out), false
	maxAnswer := s.MaxAnswerBytes
	if maxAnswer <= 0 {
		maxAnswer = DefaultMaxAnswerBytes
	}
	w := 0 // the next write's outcome
	for i, op := range sc.ops {
		if over := sc.oversize[i]; over != "" {
			if op.Kind == OpWrite {
				out = AppendResultRefused(out, over)
			} else {
				out = AppendResultError(out, over)
			}
			continue
		}
		if op.Kind == OpWrite {
			o := sc.outcomes[w]
			w++
			switch {
			case o.Refused != nil:
				out = AppendResultRefused(out, o.Refused.Error())
			case o.Newer != 0:
				out = AppendResultNewer(out, o.Newer)
			case noSpace:
				out = AppendResultNoSpace(out, store.Reason(applyErr))
			case applyErr != nil:
				out = AppendResultError(out, "store write failed")
			default:
				out = append(out, ResApplied)
			}
			continue
		}
		switch {
		case readOne && len(out)-start >= maxAnswer:
			out = append(out, ResOverLimit)
		default:
			out = s.appendRead(out, op.Key, background)
			readOne = true
		}
	}
	return out, nil
}

// expiryInBounds reports whether rec's expiry, if any, is at most
// record.MaxTTL after its version's time. Every write's expiry is its
// version's time plus its ttl (cluster's expiry), and a ttl is at most
// MaxTTL (the client API refuses more), so a record beyond it comes from
// no write: it would be stored as a value that outlives any ttl. The
// bound is the record's own version's, not this node's clock, so it takes
// no clock skew: a version too far ahead of this node is refused on its
// own (replica.ApplyRemote), which bounds a stored expiry by this node's
// time plus --max-clock-skew plus MaxTTL.
func expiryInBounds(rec *record.Record) bool {
	if rec.ExpiresAt == 0 {
		return true
	}
	// The version's milliseconds are 44 bits (hlc), so no overflow.
	return rec.ExpiresAt <= uint64(hlc.TimeOf(rec.Version).UnixMilli())+uint64(record.MaxTTL/time.Millisecond)
}

// errRebuilding is the result of a read of a rebuilding replica, and the
// start of the 503's body that refuses its stream (releases before
// ErrRebuilding send the same).
const errRebuilding = "rebuilding: this replica is still copying its share"

// ErrRebuilding fails the opening of a stream of a node that is itself
// rebuilding its share (package rebuild): it holds no record older than its
// own rebuild that another replica does not also hold.
var ErrRebuilding = errors.New(errRebuilding)

// appendRead appends the result of reading key from the replica, through
// its read cache unless background.
func (s *Server) appendRead(out, key []byte, background bool) []byte {
	if s.Rebuilding != nil && s.Rebuilding() {
		return AppendResultError(out, errRebuilding)
	}
	get := s.Replica.Get
	if background {
		get = s.Replica.GetUncached
	}
	e, err := get(key)
	switch {
	case err != nil:
		s.Log.Error("internal batch read", "err", err)
		return AppendResultError(out, "store read failed")
	case !e.Found:
		return append(out, ResNotFound)
	}
	var hdr [record.MaxHeaderSize]byte
	h := record.Record{Version: e.Rec.Version, Tombstone: e.Rec.Tombstone, ExpiresAt: e.Rec.ExpiresAt}
	return AppendResultFound(out, h.AppendEncode(hdr[:0]), e.Rec.Value)
}

// IsRefusal reports whether err refuses a request (an *Error) and returns it.
func IsRefusal(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
