package rpc

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The cluster map's epoch travels with node-to-node traffic
// (docs/membership.md):
//
//   - every batch and ping carries EpochHeader, the epoch of the map by
//     which its calls were routed (a batch of calls routed at several
//     epochs carries the oldest); so do anti-entropy summary requests
//     (refused alike) and record streams (never refused: a stream reads
//     only the other node's own records, and its caller merges every
//     node's), and a map exchange carries its map;
//   - a node whose map is newer refuses such a batch with 409 Conflict
//     and its map as the body; the sender installs it (Maps.Stale) and the
//     calls fail with ErrStaleEpoch, for their coordinators to route
//     them again by the newer map;
//   - every batch answer carries the answering node's epoch; a sender
//     that finds it older hands the peer its map (Maps.Behind, MapPath).
//
// Refusing a request from an older epoch is what lets a membership
// change move through its stages safely: once a node has installed a
// stage, no call routed by an earlier one is served by it (the check and
// the install exclude each other, see Server.Admit).
//
// A batch without EpochHeader (a tool's, a test's) is not checked.

// EpochHeader carries a cluster map's epoch in decimal.
const EpochHeader = "X-Dhtkv-Epoch"

// MapPath serves the cluster map: GET answers this node's MapState, POST
// offers a map (the body) that the node installs if it is newer, and
// answers its MapState after.
const MapPath = "/v0/internal/map"

// MaxMapBytes bounds a MapPath request body: a map of the most nodes a
// cluster can have is some 30 KiB.
const MaxMapBytes = 1 << 20

// ErrStaleEpoch fails a call refused by a peer with a newer cluster map.
var ErrStaleEpoch = errors.New("routed by an older cluster map than the replica's")

// setEpoch sets EpochHeader; epoch 0 (a tool's or test's call, routed by
// no map) sends none.
func setEpoch(h *fasthttp.RequestHeader, epoch uint64) {
	if epoch == 0 {
		return
	}
	var b [20]byte
	h.SetBytesV(EpochHeader, strconv.AppendUint(b[:0], epoch, 10))
}

// ParseEpoch parses an EpochHeader value; ok is false when it is absent
// or malformed.
func ParseEpoch(v []byte) (epoch uint64, ok bool) {
	if len(v) == 0 {
		return 0, false
	}
	e, err := strconv.ParseUint(string(v), 10, 64)
	return e, err == nil
}

// refusedStale finishes the calls of a batch the peer refused with 409:
// it hands the peer's map to Maps.Stale, then fails the calls routed at an
// epoch older than the peer's and returns the others (routed by a map as
// new as the peer's, batched with stale ones) to be sent again.
func (p *Peer) refusedStale(live []*call, resp *fasthttp.Response) []*call {
	peerEpoch, _ := ParseEpoch(resp.Header.Peek(EpochHeader))
	if p.maps != nil {
		p.maps.Stale(slices.Clone(resp.Body()))
	}
	var again []*call
	for _, c := range live {
		if peerEpoch > 0 && c.epoch >= peerEpoch {
			again = append(again, c)
			continue
		}
		c.finish(fmt.Errorf("%w (%s is at epoch %d)", ErrStaleEpoch, p.url, peerEpoch))
	}
	return again
}

// checkBehind tells Maps.Behind when the peer answered with an older epoch
// than sent.
func (p *Peer) checkBehind(resp *fasthttp.Response, sent uint64) {
	if p.maps == nil {
		return
	}
	if e, ok := ParseEpoch(resp.Header.Peek(EpochHeader)); ok && e < sent {
		p.maps.Behind(p.url, e)
	}
}

// Map exchanges cluster maps with the peer (MapPath): offer nil asks for
// the peer's MapState, a map offers it. It answers the peer's MapState.
func (p *Peer) Map(offer []byte, deadline time.Time) ([]byte, error) {
	return p.admin("cluster map from "+p.base, MapPath, offer, deadline)
}

// admin makes one request of the peer's control plane on the bulk
// connections (a GET, or a POST of body when body is not nil) and
// answers a copy of a 200's body; what names the request in its errors.
func (p *Peer) admin(what, pathQuery string, body []byte, deadline time.Time) ([]byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(p.base + pathQuery)
	if body != nil {
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBodyRaw(body)
	}
	if p.secret != "" {
		req.Header.Set(SecretHeader, p.secret)
	}
	if err := p.bulk.DoDeadline(req, resp, deadline); err != nil {
		return nil, fmt.Errorf("%s: %w", what, classify(err))
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("%s: %w: %s", what, errStatus{resp.StatusCode()}, firstLine(resp.Body()))
	}
	return slices.Clone(resp.Body()), nil
}

// FetchMap asks the node at baseURL (http://host:port) for its MapState:
// how a node started with --join learns the cluster. o is used for its
// Secret, Dial, TLS and Timeout.
func FetchMap(baseURL string, o PeerOptions) ([]byte, error) {
	p := NewPeer(baseURL, o, nil)
	defer p.Close()
	return p.Map(nil, time.Now().Add(max(o.Timeout, 5*time.Second)))
}

// Maps is the node's side of the map protocol (package membership
// implements it): the server gates batches and serves MapPath with it,
// and peers hand it the maps they meet. A nil Maps gates nothing and
// serves no map.
type Maps interface {
	// Admit is called with a batch's epoch before anything of it is
	// served: true admits it, and Release must then be called once it is
	// served; false refuses it (the node's map is newer). Installing a
	// map waits for every admitted batch to be released, so a batch is
	// served wholly under one epoch.
	Admit(epoch uint64) bool
	Release()
	// Epoch is the installed map's.
	Epoch() uint64
	// State answers GET MapPath and a refusal's body.
	State() []byte
	// Offer answers POST MapPath: the node installs the offered map if
	// it is newer (an *Error refuses it).
	Offer(state []byte) ([]byte, error)
	// Stale is given the map state of a peer that refused a call for
	// carrying an older epoch than its own, before the calls made at
	// that epoch fail with ErrStaleEpoch: the node installs the map.
	Stale(peerState []byte)
	// Behind is told (on the sender's goroutine: it must not block)
	// that the peer at url answered with an epoch older than the
	// batch's: the node hands it the newer map.
	Behind(url string, epoch uint64)
	// Reaches answers ReachPath: whether the member at url answers this
	// node now (a ping of its own; this node itself answers). An *Error
	// refuses a URL that is not a member.
	Reaches(url string) (bool, error)
}

// Admit checks a batch's EpochHeader value (see Maps.Admit). A batch
// without one, or a server without Maps, is admitted, and release is then
// a no-op.
func (s *Server) Admit(header []byte) (admitted bool) {
	if s.Maps == nil {
		return true
	}
	e, ok := ParseEpoch(header)
	if !ok {
		return true
	}
	return s.Maps.Admit(e)
}

// Release ends what Admit admitted.
func (s *Server) Release(header []byte) {
	if s.Maps == nil {
		return
	}
	if _, ok := ParseEpoch(header); ok {
		s.Maps.Release()
	}
}

// AppendEpoch appends this node's epoch (0 without Maps).
func (s *Server) AppendEpoch(dst []byte) []byte {
	var e uint64
	if s.Maps != nil {
		e = s.Maps.Epoch()
	}
	return strconv.AppendUint(dst, e, 10)
}
