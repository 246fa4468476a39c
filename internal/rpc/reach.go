package rpc

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"
)

// ReachPath asks a node whether another member of its map answers it:
// what a member asks of every other before it counts a node dead for a
// replace or a remove (package membership). One ping from the member
// asked cannot tell a dead node from a link cut between those two; a
// node that any member reaches is alive.
//
//	GET /v0/internal/reach?node=URL → 200 "answers" or "silent"; 400 for a
//	URL that is not a member of the node's map
const ReachPath = "/v0/internal/reach"

const (
	reachAnswers = "answers"
	reachSilent  = "silent"
)

// HandleReach answers ReachPath's request by the node's Maps.Reaches.
func (s *Server) HandleReach(ctx *fasthttp.RequestCtx) {
	if s.Maps == nil {
		ctx.Error("this node serves no cluster map\n", fasthttp.StatusBadRequest)
		return
	}
	node := ctx.QueryArgs().Peek("node")
	if len(node) == 0 {
		ctx.Error("missing node=URL\n", fasthttp.StatusBadRequest)
		return
	}
	answers, err := s.Maps.Reaches(string(node))
	if err != nil {
		s.fail(ctx, err)
		return
	}
	if answers {
		ctx.SetBodyString(reachAnswers + "\n")
	} else {
		ctx.SetBodyString(reachSilent + "\n")
	}
}

// Answered reports whether err, returned by a call to a peer, still
// came from a process at the peer's address: nil; any HTTP status, a
// stale epoch's 409 and a 403 for a cluster secret that differs among
// them; or a TLS handshake the other end took part in (a certificate
// this node does not trust, plain HTTP where TLS was asked, or its alert:
// TLS 1.2 refusing this node's client certificate). A node
// that answers so is alive, though it may not serve this one. The errors
// of a connection never made, left unanswered or closed unanswered (a
// refused or timed-out connect, a read that timed out, a cut link, a
// kept-alive connection whose process has died) count as silence: so
// does, for want of a way to tell it from the last, a TLS 1.3 server
// that closes the connection because this node lacks the client
// certificate it wants (fasthttp reports the close, not the alert).
func Answered(err error) bool {
	var (
		status errStatus
		verify *tls.CertificateVerificationError
		header tls.RecordHeaderError
		op     *net.OpError
	)
	return err == nil || errors.Is(err, ErrStaleEpoch) || errors.As(err, &status) ||
		errors.As(err, &verify) || errors.As(err, &header) ||
		errors.As(err, &op) && op.Op == "remote error" // an alert the other end sent (crypto/tls)
}

// Reach asks the peer whether the member at target answers it
// (ReachPath).
func (p *Peer) Reach(target string, deadline time.Time) (bool, error) {
	body, err := p.admin("reach of "+target+" from "+p.base, ReachPath+"?node="+url.QueryEscape(target), nil, deadline)
	if err != nil {
		return false, err
	}
	return parseReach(body)
}

// Reach is as for Peer.
func (d *Direct) Reach(target string, _ time.Time) (bool, error) {
	if err := d.reach(); err != nil {
		return false, fmt.Errorf("reach of %s from %s: %w", target, d.URL, err)
	}
	if d.Server.Maps == nil {
		return false, fmt.Errorf("reach of %s from %s: it serves no cluster map", target, d.URL)
	}
	answers, err := d.Server.Maps.Reaches(target)
	if err != nil {
		return false, fmt.Errorf("reach of %s from %s: %w", target, d.URL, err)
	}
	return answers, nil
}

func parseReach(body []byte) (bool, error) {
	switch string(bytes.TrimSpace(body)) {
	case reachAnswers:
		return true, nil
	case reachSilent:
		return false, nil
	}
	return false, fmt.Errorf("reach: unexpected answer %q", firstLine(body))
}
