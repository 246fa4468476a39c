package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/store"
)

// SummaryPath is where a node asks a replica peer to compare summaries of
// what they hold (package antientropy). The asking node
// drives the comparison in two steps, each a POST whose body starts with
// its step byte; the peer only answers from its store (see store.SegmentHashes):
//
// Step 'p', partitions: the asker sends, for each partition it shares
// with the peer, its partition hash:
//
//	'p' { partition (2 bytes) hash (8 bytes) } ...
//
// and the peer answers, for each partition whose hash differs from its
// own, all its segment hashes:
//
//	{ partition (2 bytes) Segments × hash (8 bytes) } ...
//
// Step 's', segments: the asker sends the segments whose hashes differ:
//
//	's' { partition (2 bytes) segment (1 byte) } ...
//
// and the peer lists, for as many of them as fit in SummaryAnswerBytes
// (always at least one), in the order asked, its (key, version) entries:
//
//	{ partition (2) segment (1) uvarint count { uvarint key length, key, version (8) } ... } ...
//
// The asker asks again for the segments left out. Then it reads the keys
// the peer holds newer, and writes those it holds newer, with ordinary
// batches (BatchPath): the summary protocol never carries a value.
//
// Integers are big-endian. A malformed request gets 400, a request to a
// rebuilding node 503 (its summaries are not its share yet).
const SummaryPath = "/v0/internal/summary"

// Summary steps (the first byte of a SummaryPath request).
const (
	SumPartitions = 'p'
	SumSegments   = 's'
)

// SummaryAnswerBytes is roughly the most a segments answer carries; the
// asker asks again for the rest.
const SummaryAnswerBytes = 4 << 20

// MaxSummaryRequestBytes is the largest summary request: every partition's
// hash in one step 'p' request (askers send at most 1024 a request).
const MaxSummaryRequestBytes = 1 + 10*partition.Count

// Segment names one segment of one partition.
type Segment struct {
	Part partition.ID
	Seg  uint8
}

// SegmentHashes is one partition's segment hashes.
type SegmentHashes struct {
	Part   partition.ID
	Hashes [partition.Segments]uint64
}

// Entry is one key's version in a segment listing.
type Entry struct {
	Key     []byte
	Version uint64
}

// SegmentList is a segment's entries, in key order.
type SegmentList struct {
	Segment
	Entries []Entry
}

var errSummaryMalformed = errors.New("malformed summary request")

// minEntry is the fewest bytes an entry of a segments answer takes: a
// key length, one key byte, a version.
const minEntry = 1 + 1 + 8

// ServeSummary answers one SummaryPath request from this node's store and
// appends the answer to out. Nothing of body is kept.
func (s *Server) ServeSummary(body, out []byte) ([]byte, error) {
	if s.Rebuilding != nil && s.Rebuilding() {
		return out, refuse(http.StatusServiceUnavailable, "%s", errRebuilding)
	}
	if len(body) == 0 {
		return out, refuse(http.StatusBadRequest, "%v: empty", errSummaryMalformed)
	}
	st := s.Replica.Store
	switch step, rest := body[0], body[1:]; step {
	case SumPartitions:
		if len(rest)%10 != 0 {
			return out, refuse(http.StatusBadRequest, "%v: %d bytes of partition hashes", errSummaryMalformed, len(rest))
		}
		var segs [partition.Segments]uint64
		for ; len(rest) > 0; rest = rest[10:] {
			part := partition.ID(binary.BigEndian.Uint16(rest))
			if part >= partition.Count {
				return out, refuse(http.StatusBadRequest, "%v: partition %d", errSummaryMalformed, part)
			}
			if err := st.SegmentHashes(part, &segs); err != nil {
				return out, fmt.Errorf("serve summary: %w", err)
			}
			var h uint64
			for _, x := range segs {
				h ^= x
			}
			if h == binary.BigEndian.Uint64(rest[2:]) {
				continue
			}
			out = binary.BigEndian.AppendUint16(out, uint16(part))
			for _, x := range segs {
				out = binary.BigEndian.AppendUint64(out, x)
			}
		}
		return out, nil
	case SumSegments:
		if len(rest)%3 != 0 {
			return out, refuse(http.StatusBadRequest, "%v: %d bytes of segments", errSummaryMalformed, len(rest))
		}
		start := len(out)
		r := st.NewSegmentReader()
		defer r.Close()
		for ; len(rest) > 0 && (len(out) == start || len(out)-start < SummaryAnswerBytes); rest = rest[3:] {
			part, seg := partition.ID(binary.BigEndian.Uint16(rest)), rest[2]
			if part >= partition.Count || seg >= partition.Segments {
				return out, refuse(http.StatusBadRequest, "%v: segment %d/%d", errSummaryMalformed, part, seg)
			}
			var err error
			if out, err = appendSegmentList(out, r, part, seg); err != nil {
				return out, fmt.Errorf("serve summary: %w", err)
			}
		}
		return out, nil
	}
	return out, refuse(http.StatusBadRequest, "%v: unknown step %q", errSummaryMalformed, body[0])
}

// appendSegmentList appends one segment's listing. The count comes first,
// so the entries are gathered before they are appended.
func appendSegmentList(out []byte, r *store.SegmentReader, part partition.ID, seg uint8) ([]byte, error) {
	var body []byte
	n := 0
	err := r.Entries(part, int(seg), func(_ uint8, key []byte, e store.IndexEntry) error {
		body = binary.AppendUvarint(body, uint64(len(key)))
		body = append(body, key...)
		body = binary.BigEndian.AppendUint64(body, e.Version)
		n++
		return nil
	})
	if err != nil {
		return out, err
	}
	out = binary.BigEndian.AppendUint16(out, uint16(part))
	out = append(out, seg)
	out = binary.AppendUvarint(out, uint64(n))
	return append(out, body...), nil
}

// AppendPartitionsRequest appends a step 'p' request for parts, whose
// hashes are hashes (same length), to dst.
func AppendPartitionsRequest(dst []byte, parts []partition.ID, hashes []uint64) []byte {
	dst = append(dst, SumPartitions)
	for i, p := range parts {
		dst = binary.BigEndian.AppendUint16(dst, uint16(p))
		dst = binary.BigEndian.AppendUint64(dst, hashes[i])
	}
	return dst
}

// ParsePartitionsAnswer parses a step 'p' answer. Every partition must be
// one that was asked for.
func ParsePartitionsAnswer(buf []byte, asked []partition.ID) ([]SegmentHashes, error) {
	const size = 2 + 8*partition.Segments
	if len(buf)%size != 0 {
		return nil, fmt.Errorf("partitions answer of %d bytes: %w", len(buf), errSummaryMalformed)
	}
	out := make([]SegmentHashes, 0, len(buf)/size)
	for ; len(buf) > 0; buf = buf[size:] {
		sh := SegmentHashes{Part: partition.ID(binary.BigEndian.Uint16(buf))}
		if !slices.Contains(asked, sh.Part) {
			return nil, fmt.Errorf("partitions answer: partition %d was not asked for: %w", sh.Part, errSummaryMalformed)
		}
		for i := range sh.Hashes {
			sh.Hashes[i] = binary.BigEndian.Uint64(buf[2+8*i:])
		}
		out = append(out, sh)
	}
	return out, nil
}

// AppendSegmentsRequest appends a step 's' request for segs to dst.
func AppendSegmentsRequest(dst []byte, segs []Segment) []byte {
	dst = append(dst, SumSegments)
	for _, s := range segs {
		dst = binary.BigEndian.AppendUint16(dst, uint16(s.Part))
		dst = append(dst, s.Seg)
	}
	return dst
}

// ParseSegmentsAnswer parses a step 's' answer to a request for asked: a
// prefix of asked, at least one. Keys alias buf; a key longer than
// maxKeyBytes (0: no limit) is malformed.
func ParseSegmentsAnswer(buf []byte, asked []Segment, maxKeyBytes int) ([]SegmentList, error) {
	if maxKeyBytes <= 0 {
		maxKeyBytes = len(buf)
	}
	var out []SegmentList
	for len(buf) > 0 {
		if len(out) == len(asked) || len(buf) < 3 {
			return nil, fmt.Errorf("segments answer: %d bytes beyond the asked segments: %w", len(buf), errSummaryMalformed)
		}
		l := SegmentList{Segment: Segment{Part: partition.ID(binary.BigEndian.Uint16(buf)), Seg: buf[2]}}
		if l.Segment != asked[len(out)] {
			return nil, fmt.Errorf("segments answer: segment %d/%d, asked %d/%d: %w", l.Part, l.Seg, asked[len(out)].Part, asked[len(out)].Seg, errSummaryMalformed)
		}
		n, k := binary.Uvarint(buf[3:])
		// Each entry takes at least minEntry bytes: a count beyond what
		// the rest holds is refused before it is allocated for.
		if k <= 0 || n > uint64(len(buf)-3-k)/minEntry {
			return nil, fmt.Errorf("segments answer: bad count: %w", errSummaryMalformed)
		}
		buf = buf[3+k:]
		l.Entries = make([]Entry, 0, n)
		for range n {
			kl, k := binary.Uvarint(buf)
			if k <= 0 || kl == 0 || kl > uint64(maxKeyBytes) || uint64(len(buf)-k) < kl+8 {
				return nil, fmt.Errorf("segments answer: bad entry: %w", errSummaryMalformed)
			}
			key := buf[k : k+int(kl)]
			l.Entries = append(l.Entries, Entry{Key: key, Version: binary.BigEndian.Uint64(buf[k+int(kl):])})
			buf = buf[k+int(kl)+8:]
		}
		out = append(out, l)
	}
	if len(out) == 0 && len(asked) > 0 {
		return nil, fmt.Errorf("segments answer: empty: %w", errSummaryMalformed)
	}
	return out, nil
}

// Summary sends one SummaryPath request and returns a copy of the answer.
//
// epoch is the cluster map's the exchange runs by (see EpochHeader): a
// peer with a newer map refuses it (ErrStaleEpoch) and hands the map over.
func (p *Peer) Summary(body []byte, epoch uint64, deadline time.Time) ([]byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(p.base + SummaryPath)
	req.Header.SetMethod(fasthttp.MethodPost)
	if p.secret != "" {
		req.Header.Set(SecretHeader, p.secret)
	}
	setEpoch(&req.Header, epoch)
	req.SetBodyRaw(body)
	if err := p.bulk.DoDeadline(req, resp, deadline); err != nil {
		return nil, fmt.Errorf("summary from %s: %w", p.url, classify(err))
	}
	if resp.StatusCode() == fasthttp.StatusConflict {
		if p.maps != nil {
			p.maps.Stale(slices.Clone(resp.Body()))
		}
		return nil, fmt.Errorf("summary from %s: %w", p.url, ErrStaleEpoch)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("summary from %s: %w: %s", p.url, errStatus{resp.StatusCode()}, firstLine(resp.Body()))
	}
	return slices.Clone(resp.Body()), nil
}

// firstLine is a peer's one-line reason, bounded for a log.
func firstLine(b []byte) string {
	if i := slices.Index(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return string(b[:min(len(b), 200)])
}
