package rpc

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// ErrLinkCut fails a Direct call while its link is cut.
var ErrLinkCut = errors.New("link cut")

// Direct is a peer reached in-process: each call goes straight to the
// other node's Server on the caller's goroutine, through what an HTTP
// request meets there (the epoch gate, the batch's rules, the map
// exchange), without a connection, batching or secret. It is the
// transport seam's second implementation beside Peer (view.Peer): tests
// of the protocols build in-process clusters with it, and Cut makes a
// link fail as an unreachable node's would.
//
// The Server is the other node's; Maps, if set, is the calling node's,
// told of maps met as Peer tells it (Stale on a refusal, Behind on an
// older epoch); Now is the calling node's clock (default time.Now), for
// ClockOffset.
type Direct struct {
	URL    string
	Server *Server
	Maps   Maps
	Now    func() time.Time

	cut     atomic.Bool
	refusal atomic.Pointer[Error]
	offset  clockOffset
}

// Cut makes every call fail with ErrLinkCut (true) or go through again.
func (d *Direct) Cut(cut bool) { d.cut.Store(cut) }

// Refuse makes every call fail as Peer's does when the other node answers
// with e's status and reason (a 403 for a cluster secret that differs), or
// go through again (nil). Unlike a cut link, the other node answers: it is
// alive (Answered).
func (d *Direct) Refuse(e *Error) { d.refusal.Store(e) }

// reach is what the link lets through: ErrLinkCut while cut, the refusal
// while one is set, nil otherwise.
func (d *Direct) reach() error {
	if d.cut.Load() {
		return ErrLinkCut
	}
	if e := d.refusal.Load(); e != nil {
		return fmt.Errorf("%w: %s", errStatus{e.Status}, e.Msg)
	}
	return nil
}

// Close does nothing: a Direct holds no connection.
func (d *Direct) Close() {}

func (d *Direct) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// admit passes the other node's epoch gate as a request carrying epoch
// does; false means a refusal, after the other node's map was handed to
// Maps.
func (d *Direct) admit(epoch uint64) bool {
	if epoch == 0 || d.Server.Maps == nil || d.Server.Maps.Admit(epoch) {
		return true
	}
	if d.Maps != nil {
		d.Maps.Stale(d.Server.Maps.State())
	}
	return false
}

// release ends what admit admitted, and tells Maps of a server behind.
func (d *Direct) release(epoch uint64) {
	if epoch == 0 || d.Server.Maps == nil {
		return
	}
	theirs := d.Server.Maps.Epoch()
	d.Server.Maps.Release()
	if d.Maps != nil && theirs < epoch {
		d.Maps.Behind(d.URL, theirs)
	}
}

// batch serves one batch of ops at the other node and returns its answer.
func (d *Direct) batch(body []byte, epoch uint64) ([]byte, error) {
	if err := d.reach(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.URL, err)
	}
	if !d.admit(epoch) {
		return nil, fmt.Errorf("%w (%s)", ErrStaleEpoch, d.URL)
	}
	start := d.now()
	out, err := d.Server.ServeBatch(body, nil, false)
	d.release(epoch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.URL, err)
	}
	// The other node's clock, as Peer reads it off TimeHeader.
	peer, before := d.Server.Replica.Clock.Wall(), time.Now()
	d.offset.measuredAfter(peer, start, d.now(), before)
	return out, nil
}

// ClockOffset is as for Peer.
func (d *Direct) ClockOffset() (s view.ClockSample, ok bool) { return d.offset.get() }

// Get is as for Peer.
func (d *Direct) Get(key []byte, epoch uint64, _ time.Time) (record.Record, bool, error) {
	out, err := d.batch(AppendBatchOp(nil, OpRead, key, nil), epoch)
	if err != nil {
		return record.Record{}, false, fmt.Errorf("get from %s: %w", d.URL, err)
	}
	r, _, err := nextResult(out)
	switch {
	case err != nil:
		return record.Record{}, false, fmt.Errorf("get from %s: %w", d.URL, err)
	case r.code == ResNotFound:
		return record.Record{}, false, nil
	case r.code == ResError:
		return record.Record{}, false, fmt.Errorf("get from %s: replica error: %s", d.URL, r.msg)
	case r.code != ResFound:
		return record.Record{}, false, fmt.Errorf("get from %s: %w: result %q for a read", d.URL, errMalformed, r.code)
	}
	rec, err := record.Decode(bytes.Clone(r.envelope))
	if err != nil {
		return record.Record{}, false, fmt.Errorf("get from %s: %w", d.URL, err)
	}
	return rec, true, nil
}

// Apply is as for Peer.
func (d *Direct) Apply(key, env []byte, epoch uint64, _ time.Time) (uint64, error) {
	out, err := d.batch(AppendBatchOp(nil, OpWrite, key, env), epoch)
	if err != nil {
		return 0, fmt.Errorf("apply to %s: %w", d.URL, err)
	}
	r, _, err := nextResult(out)
	switch {
	case err != nil:
		return 0, fmt.Errorf("apply to %s: %w", d.URL, err)
	case r.code == ResNewer:
		return r.version, nil
	case r.code == ResRefused:
		return 0, fmt.Errorf("apply to %s: %w", d.URL, refusal(r.msg))
	case r.code == ResNoSpace:
		return 0, fmt.Errorf("apply to %s: %w", d.URL, storageError{r.msg})
	case r.code == ResError:
		return 0, fmt.Errorf("apply to %s: replica error: %s", d.URL, r.msg)
	}
	return 0, nil
}

// Ping is as for Peer.
func (d *Direct) Ping(epoch uint64, _ time.Time) (view.PingAnswer, error) {
	if _, err := d.batch(nil, epoch); err != nil {
		return view.PingAnswer{}, fmt.Errorf("ping %s: %w", d.URL, err)
	}
	formed, err := d.Server.Formed()
	return view.PingAnswer{Formed: formed, Rebuilding: d.Server.Rebuilding != nil && d.Server.Rebuilding(),
		Incarnation: d.Server.Incarnation, FormedAt: d.Server.formedAt(), Settings: d.Server.Settings}, err
}

// Summary is as for Peer.
func (d *Direct) Summary(body []byte, epoch uint64, _ time.Time) ([]byte, error) {
	if err := d.reach(); err != nil {
		return nil, fmt.Errorf("summary from %s: %w", d.URL, err)
	}
	if !d.admit(epoch) {
		return nil, fmt.Errorf("summary from %s: %w", d.URL, ErrStaleEpoch)
	}
	out, err := d.Server.ServeSummary(body, nil)
	d.release(epoch)
	if err != nil {
		return nil, fmt.Errorf("summary from %s: %w", d.URL, err)
	}
	return out, nil
}

// Map is as for Peer.
func (d *Direct) Map(offer []byte, _ time.Time) ([]byte, error) {
	if err := d.reach(); err != nil {
		return nil, fmt.Errorf("cluster map from %s: %w", d.URL, err)
	}
	if d.Server.Maps == nil {
		return nil, fmt.Errorf("cluster map from %s: it serves no cluster map", d.URL)
	}
	if offer == nil {
		return d.Server.Maps.State(), nil
	}
	out, err := d.Server.Maps.Offer(slices.Clone(offer))
	if err != nil {
		return nil, fmt.Errorf("cluster map from %s: %w", d.URL, err)
	}
	return out, nil
}
