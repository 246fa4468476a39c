// Package partcopy copies whole partitions of another node's records into
// this node's replica, at the speed of a stream: what a membership change
// does for the partitions a node gains (package membership) and a rebuild
// for a node's share after its disk was lost (package rebuild).
//
// One copy (Copier.Copy) opens the other node's record stream restricted
// to the partitions asked for (rpc.StreamPath with parts): the sender
// leaves out every record of the others, so nothing this node does not
// hold crosses the wire, and this side drops any that still comes (a
// sender of a release that does not filter). The records are applied in
// batches of up to a MiB through the one path by which another node's
// records are stored, replica.ApplyRemote: a version too far ahead of this
// node's clock is left out, the clock observes the rest before they are
// stored, a record older than what the key holds (a write that arrived
// here during the copy) or below the garbage-collection horizon is kept
// out, and each batch is one store commit. Every batch is applied under
// the cluster map's gate at the epoch the copy was asked for: once a newer
// map is installed the copy stops (ErrStale), so no record routed by an
// older map, of a partition this node may have dropped since, is stored.
//
// Reading and applying overlap: one goroutine decodes the next batch from
// the stream while two others apply the last ones, whose commits then
// share the WAL's fsyncs and overlap one's building with another's
// commit (the order of the applies does not matter: last-write-wins).
// The reading is throttled to Options.Rate bytes a second over every copy
// of the node together: a throttled copy stops reading, and the sender's
// stream waits on the socket.
//
// Why not Pebble's sstable ingestion: an ingested file sits above every
// write already in the memtables, so an ingested record older than a write
// that arrived during the copy would hide it, unless the records were
// ingested as merge operands, which the last-write-wins merger would
// resolve in either order. But the copy would then step around
// ApplyRemote: the clock bound and observation, the horizon and the
// anti-entropy index entry each record needs would have to be made again
// outside it, and so would any check later added to that path. Applied in
// large batches, the path is not the bottleneck (docs/benchmarks.md).
package partcopy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Options configures the copies of a node. Zero fields take the defaults
// noted (EnsureDefaults).
type Options struct {
	// Rate is the most record bytes a second (keys and envelopes) this
	// node copies in, every copy together (--move-rate; default 24 MiB/s,
	// Cassandra's stream throughput default; at least MinRate).
	Rate int64
}

// MinRate is the slowest copy allowed, 1 MiB/s: a slower one would keep
// its sender's stream waiting longer than senders allow a reader
// (--scan-min-rate).
const MinRate = 1 << 20

// DefaultRate is Rate's default.
const DefaultRate = 24 << 20

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Rate == 0 {
		o.Rate = DefaultRate
	}
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	if o.Rate != 0 && o.Rate < MinRate {
		return fmt.Errorf("--move-rate %d: must be at least %d (1 MiB) a second", o.Rate, MinRate)
	}
	return nil
}

// RegisterFlags defines the flags of the fields, with their current values
// as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	sizeflag.Var(fs, &o.Rate, "move-rate", "most record bytes a second this node copies in when a membership change gives it partitions or it rebuilds its share, a `size`")
}

// Streams opens another node's record stream of some partitions
// (rpc.StreamClient.OpenParts).
type Streams interface {
	// OpenParts opens the stream of parts' records at url; partial asks
	// a rebuilding node for its records all the same (rpc.StreamPath).
	OpenParts(ctx context.Context, url string, epoch uint64, parts *partition.Set, partial bool) (scan.Iterator, error)
}

// Gate admits a store write routed by a map epoch while no newer map is
// installed, until Release (membership.Service).
type Gate interface {
	Admit(epoch uint64) bool
	Release()
}

// ErrStale ends a copy routed by a map older than the one now installed:
// the caller asks again by the new map.
var ErrStale = errors.New("a newer cluster map was installed during the copy")

// Stats is what one copy received and did.
type Stats struct {
	// Records and Bytes are the records received of the partitions asked
	// for, and their key and envelope bytes.
	Records int
	Bytes   int64
	// Applied records were stored.
	Applied int
	// Older records were older than what this node holds (a write that
	// arrived during the copy), or below its garbage-collection horizon:
	// kept out.
	Older int
	// Refused records had versions too far ahead of this node's clock
	// (replica.Outcome.Refused): left where they are.
	Refused int
	// Foreign records were of other partitions, sent by a node that does
	// not filter its stream: dropped.
	Foreign int
}

// Add adds o's counts to s.
func (s *Stats) Add(o Stats) {
	s.Records += o.Records
	s.Bytes += o.Bytes
	s.Applied += o.Applied
	s.Older += o.Older
	s.Refused += o.Refused
	s.Foreign += o.Foreign
}

// Copier copies partitions into one replica. It is safe for concurrent
// use: concurrent copies share the rate.
type Copier struct {
	local   *replica.Replica
	streams Streams
	gate    Gate
	limit   *rate.Limiter
	batch   int // bytes a batch applies at most (one record may exceed it)
	log     *slog.Logger
	m       *metrics
}

// New returns the copier into local, which opens streams with streams and
// applies under gate.
func New(local *replica.Replica, streams Streams, gate Gate, o Options, log *slog.Logger) *Copier {
	o.EnsureDefaults()
	b := batchBytes(o.Rate)
	return &Copier{
		local: local, streams: streams, gate: gate, log: log, m: newMetrics(), batch: b,
		limit: rate.NewLimiter(rate.Limit(o.Rate), b),
	}
}

// appliers is how many batches of one copy are applied at once.
const appliers = 2

// batchBytes is the batch size for rate: a sixteenth of a second of it,
// between 64 KiB and 1 MiB. A larger batch makes fewer commits, but the
// stream is not read while a batch waits for the rate, and a sender cuts
// off a reader that stalls for seconds.
func batchBytes(rate int64) int {
	return int(min(max(rate/16, 64<<10), 1<<20))
}

// SendLimiter returns the limiter with which a node paces the partition
// streams it sends (rpc.Server.StreamPace): o's Rate and a Copier's
// burst, so that neither end of a copy outruns its --move-rate.
func SendLimiter(o Options) *rate.Limiter {
	o.EnsureDefaults()
	return rate.NewLimiter(rate.Limit(o.Rate), batchBytes(o.Rate))
}

// Limiter is the copies' shared rate limiter (Rate), for the node's
// background pace (package pace) to govern.
func (c *Copier) Limiter() *rate.Limiter { return c.limit }

// Register adds the instruments to reg.
func (c *Copier) Register(reg prometheus.Registerer) { c.m.register(reg) }

// Copy streams every record of parts from the node at url and applies
// them to the local replica, routed by the map of epoch (see the package
// comment), until the stream's end (nil), an error, ctx's end or a newer
// map (ErrStale). The stats count what was received and applied, also on
// an error: what was applied stays.
func (c *Copier) Copy(ctx context.Context, url string, epoch uint64, parts *partition.Set) (Stats, error) {
	return c.copy(ctx, url, epoch, parts, false)
}

// CopyPartial is Copy from a node that may be rebuilding its own share:
// it sends what it holds all the same (rpc.StreamPath's partial), not the
// whole of its replica. For a rebuild (package rebuild) only.
func (c *Copier) CopyPartial(ctx context.Context, url string, epoch uint64, parts *partition.Set) (Stats, error) {
	return c.copy(ctx, url, epoch, parts, true)
}

func (c *Copier) copy(ctx context.Context, url string, epoch uint64, parts *partition.Set, partial bool) (Stats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	it, err := c.streams.OpenParts(ctx, url, epoch, parts, partial)
	if err != nil {
		return Stats{}, err
	}
	defer it.Close()

	// The reader fills a batch while up to appliers others are applied.
	full := make(chan *batch, appliers)
	free := make(chan *batch, appliers+1)
	for range appliers + 1 {
		free <- &batch{}
	}
	var read Stats // the reader's counts, read once it is done
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(full)
		b := <-free
		for it.Next() {
			key, env := it.Key(), it.Envelope()
			if !parts.HasKey(key) {
				read.Foreign++
				continue
			}
			read.Records++
			read.Bytes += int64(len(key) + len(env))
			b.add(key, env)
			if len(b.buf) < c.batch {
				continue
			}
			if c.throttle(ctx, len(b.buf)) != nil {
				return
			}
			select {
			case full <- b:
			case <-ctx.Done():
				return
			}
			select {
			case b = <-free:
			case <-ctx.Done():
				return
			}
		}
		// What came before an error is applied too: it is as good as any.
		if readErr = it.Err(); len(b.spans) > 0 && c.throttle(ctx, len(b.buf)) == nil {
			select {
			case full <- b:
			case <-ctx.Done():
			}
		}
	}()

	var mu sync.Mutex // guards st and applyErr
	var st Stats
	var applyErr error
	var wg sync.WaitGroup
	for range appliers {
		wg.Go(func() {
			for b := range full {
				mu.Lock()
				failed := applyErr != nil
				mu.Unlock()
				if !failed {
					var bs Stats
					err := c.apply(epoch, b, &bs)
					mu.Lock()
					st.Add(bs)
					if err != nil && applyErr == nil {
						applyErr = err
						cancel() // the reader stops; the batches it still hands are dropped
					}
					mu.Unlock()
				}
				b.reset()
				free <- b
			}
		})
	}
	wg.Wait()
	<-done
	st.Records, st.Bytes, st.Foreign = read.Records, read.Bytes, read.Foreign
	c.m.bytes.Add(float64(st.Bytes))
	c.m.records.WithLabelValues("stored").Add(float64(st.Applied))
	c.m.records.WithLabelValues("older").Add(float64(st.Older))
	c.m.records.WithLabelValues("refused").Add(float64(st.Refused))
	c.m.records.WithLabelValues("foreign").Add(float64(st.Foreign))
	if st.Refused > 0 {
		c.log.Warn("copy: records left out, their versions too far ahead of this node's clock", "peer", url, "records", st.Refused)
	}
	if st.Foreign > 0 {
		c.log.Warn("copy: the sender streamed records of partitions not asked for (a release without partition streams?); dropped", "peer", url, "records", st.Foreign)
	}
	switch {
	case applyErr != nil:
		return st, applyErr
	case readErr != nil:
		return st, fmt.Errorf("copy from %s: %w", url, readErr)
	}
	return st, ctx.Err()
}

// throttle waits until the rate allows n more bytes.
func (c *Copier) throttle(ctx context.Context, n int) error {
	start := time.Now()
	defer func() { c.m.throttled.Add(time.Since(start).Seconds()) }()
	if err := pace.WaitBytes(ctx, c.limit, n); err != nil {
		// The wait would outlast ctx's deadline: wait for the end.
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// apply stores b through ApplyRemote under the gate.
func (c *Copier) apply(epoch uint64, b *batch, st *Stats) error {
	if err := b.prepare(); err != nil {
		return err
	}
	if !c.gate.Admit(epoch) {
		return ErrStale
	}
	var err error
	b.outcomes, err = c.local.ApplyRemote(b.writes, b.outcomes)
	c.gate.Release()
	if err != nil {
		return fmt.Errorf("copy: apply %d records: %w", len(b.writes), err)
	}
	for _, o := range b.outcomes {
		switch {
		case o.Refused != nil:
			st.Refused++
		case o.Newer != 0:
			st.Older++
		default:
			st.Applied++
		}
	}
	return nil
}

// batch holds records read from a stream, copied out of its buffers: keys
// and envelopes back to back in buf, and where each one is.
type batch struct {
	buf      []byte
	spans    []span
	writes   []store.Write
	recs     []record.Record
	outcomes []replica.Outcome
}

// span is one record's key, buf[start:mid], and envelope, buf[mid:end].
type span struct{ start, mid, end int }

func (b *batch) add(key, env []byte) {
	start := len(b.buf)
	b.buf = append(append(b.buf, key...), env...)
	b.spans = append(b.spans, span{start, start + len(key), len(b.buf)})
}

// prepare makes the writes of the batch's records, which alias buf.
func (b *batch) prepare() error {
	b.writes, b.recs = b.writes[:0], b.recs[:0]
	for _, s := range b.spans {
		rec, err := record.Decode(b.buf[s.mid:s.end])
		if err != nil {
			return fmt.Errorf("copy: key %q: %w", b.buf[s.start:s.mid], err)
		}
		b.recs = append(b.recs, rec)
	}
	for i, s := range b.spans {
		b.writes = append(b.writes, store.Write{Key: b.buf[s.start:s.mid], Rec: &b.recs[i]})
	}
	return nil
}

func (b *batch) reset() {
	b.buf, b.spans = b.buf[:0], b.spans[:0]
	if cap(b.buf) > 4<<20 {
		b.buf = nil // a huge record's buffer is not kept
	}
}

// metrics are the copies' instruments.
type metrics struct {
	bytes     prometheus.Counter
	records   *prometheus.CounterVec
	throttled prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_copy_bytes_total",
			Help: "Record bytes (keys and envelopes) received by partition copies: membership moves and rebuilds.",
		}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_copy_records_total",
			Help: "Records received by partition copies, by outcome: stored; older than what this node held (or below its horizon) and kept out; refused, too far ahead of its clock; foreign, of a partition not asked for, dropped.",
		}, []string{"outcome"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_copy_throttled_seconds_total",
			Help: "Seconds partition copies waited for --move-rate.",
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.bytes, m.records, m.throttled)
}
