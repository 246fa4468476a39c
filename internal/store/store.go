// Package store keeps dhtkv's records durably in Pebble.
//
// Every user key is stored under the data prefix 'd' with a record envelope
// (package record) as its value; writes are Pebble merges resolved by
// last-write-wins on the version (merge.go), so Put and Delete are the same
// operation: Apply. The same batch records the key's version in the
// anti-entropy index (summary.go), from which replicas' summaries are
// computed without reading values. A meta key records the on-disk layout
// version so that an incompatible directory is refused at Open instead of
// misread, and an older one is upgraded.
package store

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

const (
	dataPrefix = 'd'
	// layoutKey holds layoutVersion; it sorts before every data key.
	layoutKey = "\x00layout"
	// layoutVersion is the layout this release writes: 2 added the
	// anti-entropy index, 3 records that may expire (package record's
	// expires flag) and index entries that tell garbage collection what
	// it may remove. Older directories are upgraded at Open by building
	// the index anew (buildIndex).
	layoutVersion = "dhtkv-layout-3"
	layout1       = "dhtkv-layout-1"
	layout2       = "dhtkv-layout-2"
	// clockKey holds the node clock's persisted upper bound (package hlc).
	clockKey = "\x00clock"
)

// FormatMajorVersion is pinned rather than left to Pebble's default so that
// upgrading the library never silently ratchets the on-disk format (which
// cannot be undone); raise it deliberately.
const FormatMajorVersion = pebble.FormatValueSeparation

// Options configures a Store. Zero fields take the defaults noted.
type Options struct {
	// Sync makes every acknowledged write durable (fsync of the WAL before
	// Apply returns; --sync, default true in DefaultOptions). Concurrent writers share fsyncs in Pebble's commit
	// pipeline. With Sync false, Pebble buffers WAL writes in the process
	// and even a process crash can lose acknowledged writes.
	Sync bool
	// BlockCacheBytes sizes Pebble's block cache in bytes
	// (--block-cache-bytes; default 64 MiB).
	BlockCacheBytes int64
	// MemTableBytes sizes one memtable in bytes (--memtable-bytes;
	// default 16 MiB); up to
	// MemTableStopWrites of them (4) can be in memory while flushes lag.
	MemTableBytes uint64
	// L0CompactionThreshold is how many L0 sublevels (roughly: memtable
	// flushes) accumulate before they are compacted into the level below
	// (--l0-compaction-threshold; default 16; Pebble's own default is 4). Writes stall at four times
	// as many. See docs/storage.md: overwrite-heavy workloads rewrite the
	// base level on every L0 compaction, so compacting 16 flushes at once
	// instead of 4 costs a PUT much less CPU (figures there), at the price
	// of more files for a cache-missing GET to consult (one bloom filter
	// each) and for a range scan to merge.
	L0CompactionThreshold int
	// WALMinSyncInterval is the least time between two fsyncs of the WAL
	// (--wal-min-sync-interval; DefaultOptions: 200µs when the process
	// runs on one P, GOMAXPROCS=1, and 0, none, otherwise; 0 stays 0).
	// Writes that arrive while the interval runs wait for the next fsync
	// and share it; a write that arrives longer than the interval after
	// the last fsync is not delayed.
	//
	// Why one P needs it: Pebble's WAL flusher is one goroutine that
	// calls fsync, a blocking system call that keeps the process's only
	// P until the runtime's monitor takes it back, so no request is
	// parsed while the disk syncs and each fsync carries about one write
	// (5.5k PUT/s on one core). Waiting on a timer instead frees the P:
	// the writes that arrive meanwhile share the next fsync (27k PUT/s;
	// docs/benchmarks.md section 16). With more Ps the requests run
	// during the fsync anyway, and a wait would only cost latency
	// (closed loop at 8 connections on 2 cores: 30% fewer PUT/s).
	WALMinSyncInterval time.Duration
	// MinFreeSpace is the free space, a size or a percentage of the data
	// volume, below which the store refuses the writes that grow it,
	// records and hints, with ErrInsufficientStorage (--min-free-space;
	// DefaultOptions: 5%, Elasticsearch's flood stage; 0 turns the guard
	// off, and EnsureDefaults leaves it so). Writes resume once free
	// space is back above it by a quarter of it (space.go). Leave room
	// for what Pebble still writes after: the memtables already written
	// (up to 4 × MemTableBytes, flushed) and a compaction's output.
	MinFreeSpace sizeflag.Amount
	// Ballast is the size of the emergency ballast file made in the data
	// directory at Open (BallastFile; --ballast-size), a size or a
	// percentage of the volume, a percentage at most 1 GiB
	// (DefaultOptions: 1%, CockroachDB's default; 0: none, and any
	// ballast there is removed). Deleting it frees its space at once.
	Ballast sizeflag.Amount
	// BallastLater leaves the ballast to MakeBallast, for a caller that
	// first checks that the directory is its own (the node: its identity
	// and a restored snapshot's age), so that a directory it refuses is
	// not written to (no flag). The default value is false: Open makes
	// it.
	BallastLater bool
	// StatFS reports the usage of the volume holding a directory (no
	// flag: tests inject a volume's state). The default value is nil:
	// FS's GetDiskUsage, statfs(2) on the operating system's file
	// system; a file system that has none (vfs.NewMem()) is not guarded.
	StatFS func(dir string) (vfs.DiskUsage, error)
	// SpaceCheckInterval is how old the last reading of the volume's
	// free space may be before a write, a status or a scrape reads it
	// again (no flag). The default value is 1 s.
	SpaceCheckInterval time.Duration
	Logger             *slog.Logger
	// FS is the file system Pebble keeps the store in (default nil: the
	// operating system's, vfs.Default). Tests pass vfs.NewMem() to run a
	// node without a disk; a MemFS that outlives a Close keeps the data
	// for the next Open, as a directory would. Everything the store
	// persists (records, hints, identity, clock bound, cluster map) is in
	// Pebble, so all of it follows FS; a Checkpoint goes to FS as well.
	FS vfs.FS
}

// MemTableStopWrites is how many memtables may queue before writes stall.
const MemTableStopWrites = 4

// DefaultOptions returns the defaults the fields document, Sync on.
func DefaultOptions() Options {
	o := Options{
		Sync: true, BlockCacheBytes: 64 << 20, MemTableBytes: 16 << 20, L0CompactionThreshold: 16,
		MinFreeSpace: sizeflag.Amount{Percent: 5}, Ballast: sizeflag.Amount{Percent: 1},
	}
	if runtime.GOMAXPROCS(0) == 1 {
		o.WALMinSyncInterval = onePSyncInterval
	}
	return o
}

// onePSyncInterval is WALMinSyncInterval's default on one P: long enough
// for a core to parse a few dozen requests, short against an fsync's
// 0.2-2 ms.
const onePSyncInterval = 200 * time.Microsecond

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Sync, "sync", o.Sync, "fsync the WAL before acknowledging each write (false: fast, can lose acknowledged writes on a crash)")
	sizeflag.Var(fs, &o.BlockCacheBytes, "block-cache-bytes", "Pebble block cache, a `size`")
	sizeflag.Var(fs, &o.MemTableBytes, "memtable-bytes", "Pebble memtable, a `size` (up to 4 in memory)")
	fs.IntVar(&o.L0CompactionThreshold, "l0-compaction-threshold", o.L0CompactionThreshold, "L0 sublevels that trigger a compaction into the level below (writes stall at 4x)")
	fs.DurationVar(&o.WALMinSyncInterval, "wal-min-sync-interval", o.WALMinSyncInterval, "least time between two WAL fsyncs; writes arriving meanwhile share the next one (0: none)")
	sizeflag.AmountVar(fs, &o.MinFreeSpace, "min-free-space", "free space of the data volume, a `size or percentage`, below which PUT, DELETE and replica writes are refused with 507 until it is back above it by a quarter (0: off)")
	sizeflag.AmountVar(fs, &o.Ballast, "ballast-size", "emergency ballast file made in the data directory at start-up, a `size or percentage` of the volume (a percentage at most 1GiB); delete it to free its space at once (0: none)")
}

// Validate refuses the settings Pebble would misuse.
func (o *Options) Validate() error {
	switch {
	case o.MemTableBytes == 0:
		return errors.New("--memtable-bytes must be positive")
	case o.L0CompactionThreshold < 1:
		return errors.New("--l0-compaction-threshold must be at least 1")
	case o.WALMinSyncInterval < 0 || o.WALMinSyncInterval > 100*time.Millisecond:
		return fmt.Errorf("--wal-min-sync-interval %v: must be between 0 and 100ms", o.WALMinSyncInterval)
	case o.MinFreeSpace.Percent >= 80:
		return fmt.Errorf("--min-free-space %v: a percentage must be below 80%%", o.MinFreeSpace)
	case o.Ballast.Percent > 10:
		return fmt.Errorf("--ballast-size %v: a percentage must be at most 10%%", o.Ballast)
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults (Sync has
// none: false is a choice).
func (o *Options) EnsureDefaults() {
	if o.BlockCacheBytes <= 0 {
		o.BlockCacheBytes = 64 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = 16 << 20
	}
	if o.L0CompactionThreshold <= 0 {
		o.L0CompactionThreshold = 16
	}
	if o.SpaceCheckInterval <= 0 {
		o.SpaceCheckInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Store is a Pebble database holding record envelopes. It is safe for
// concurrent use.
type Store struct {
	db  *pebble.DB
	dir string
	// fs is the file system the store is in (Options.FS), as given: Pebble
	// writes through a wrapper of it that calls onDiskFull.
	fs        vfs.FS
	ballast   sizeflag.Amount // Options.Ballast
	guard     *spaceGuard
	health    health
	opening   atomic.Bool   // in Open: Pebble's Fatalf panics, and Open recovers it
	closeWait time.Duration // how long Close waits for Pebble once the store failed
	writeOpt  *pebble.WriteOptions
	keyBufs   sync.Pool // *[]byte scratch for prefixed keys on reads
	stalls    stallCounter
	jobs      jobTimes
	summary   summary
	gc        gcState
	log       *slog.Logger
	// iters counts the Iters holding a Pebble iterator (open and not
	// released): each pins the memtables and sstables of its snapshot.
	iters atomic.Int64
}

// Open opens (creating if needed) the store in dir, and makes its
// emergency ballast (ballast.go) if it has none.
func Open(dir string, o Options) (*Store, error) {
	o.EnsureDefaults()
	cache := pebble.NewCache(o.BlockCacheBytes)
	defer cache.Unref() // the DB holds its own reference

	fsys := o.FS
	if fsys == nil {
		fsys = vfs.Default
	}
	s := &Store{dir: dir, fs: fsys, writeOpt: pebble.NoSync, log: o.Logger, jobs: newJobTimes(), closeWait: closeWaitAfterFailure}
	s.health.failedCh = make(chan struct{})
	statfs := o.StatFS
	if statfs == nil {
		statfs = fsys.GetDiskUsage
	}
	s.guard = newSpaceGuard(dir, statfs, o.MinFreeSpace, o.SpaceCheckInterval, o.Logger)
	pebbleLog := o.Logger.With("component", "pebble")
	popts := &pebble.Options{
		Cache:                       cache,
		FormatMajorVersion:          FormatMajorVersion,
		MemTableSize:                o.MemTableBytes,
		MemTableStopWritesThreshold: MemTableStopWrites,
		L0CompactionThreshold:       o.L0CompactionThreshold,
		L0StopWritesThreshold:       4 * o.L0CompactionThreshold,
		Merger:                      lwwMerger,
		Logger:                      slogLogger{l: pebbleLog, fail: s.fail, opening: s.opening.Load},
		// Every write Pebble makes that meets ENOSPC calls onDiskFull,
		// then is tried once more; one that fails still fails the store
		// at once (fileError).
		FS: watchFS{FS: vfs.OnDiskFull(fsys, s.onDiskFull), onError: s.fileError, raw: fsys, dir: filepath.Clean(dir)},
	}
	if d := o.WALMinSyncInterval; d > 0 {
		popts.WALMinSyncInterval = func() time.Duration { return d }
	}
	s.summary.init()
	popts.EventListener = s.eventListener(pebbleLog)
	for i := range popts.Levels {
		// Point reads of absent keys are common (GET of a never-written
		// key, first write of a key): a bloom filter on every level, L0
		// included, answers most of them without reading data blocks.
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		popts.Levels[i].FilterType = pebble.TableFilter
	}
	s.keyBufs.New = func() any { b := make([]byte, 0, 64); return &b }
	if o.Sync {
		s.writeOpt = pebble.Sync
	}
	if err := s.open(popts); err != nil {
		return nil, err
	}
	s.ballast = o.Ballast
	if !o.BallastLater {
		s.MakeBallast()
	}
	return s, nil
}

// MakeBallast makes the emergency ballast Options.Ballast asks for, if it
// is not there yet: Open does, unless Options.BallastLater. Its errors
// are not the store's (a node runs without a ballast): it logs them.
func (s *Store) MakeBallast() {
	r := s.guard.reading()
	if err := s.ensureBallast(ballastBytes(s.ballast, r.total), r); err != nil {
		s.log.Warn("no emergency ballast", "err", err)
	}
}

// open opens Pebble and checks what it holds. A fatal error of Pebble's
// on open's goroutine meanwhile (a MANIFEST it cannot write on a full
// disk) fails the Open instead of the process (slogLogger.Fatalf); one
// on a goroutine of Pebble's own (a flush or compaction while open
// rebuilds the layout) ends the process, its message logged first: the
// node fails to start either way.
func (s *Store) open(popts *pebble.Options) (err error) {
	s.opening.Store(true)
	defer s.opening.Store(false)
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("open store %s: %w", s.dir, f.err)
		}
	}()
	db, err := pebble.Open(s.dir, popts)
	if err != nil {
		return fmt.Errorf("open store %s: %w", s.dir, err)
	}
	s.db = db
	if err := s.checkLayout(); err != nil {
		db.Close()
		return err
	}
	if err := s.loadHorizons(); err != nil {
		db.Close()
		return err
	}
	return nil
}

// onDiskFull runs when a write of Pebble's met ENOSPC, before Pebble
// tries it once more; writes through Pebble's file system wait
// meanwhile. The volume is full whatever the guard last read, so the
// guard refuses writes from now on (until the volume is back above its
// resume threshold), and the ballast goes, so that the write tried
// again, and the flushes and compactions after it, find room.
func (s *Store) onDiskFull() {
	freed := s.removeBallast()
	why := "ENOSPC"
	if freed > 0 {
		why = fmt.Sprintf("ENOSPC; the emergency ballast was removed, freeing %s", iBytes(freed))
	}
	s.guard.markFull(why)
	s.log.Error("disk full: Pebble met ENOSPC; writes are refused (507) until space is freed", "dir", s.dir,
		"ballast_removed_bytes", freed)
}

func (s *Store) checkLayout() error {
	v, closer, err := s.db.Get([]byte(layoutKey))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		if err := s.write(func() error { return s.db.Set([]byte(layoutKey), []byte(layoutVersion), pebble.Sync) }); err != nil {
			return fmt.Errorf("open store %s: write layout: %w", s.dir, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("open store %s: read layout: %w", s.dir, err)
	}
	layout := string(v)
	closer.Close()
	switch layout {
	case layoutVersion:
		return nil
	case layout1, layout2:
		return s.buildIndex(layout)
	}
	return fmt.Errorf("open store %s: layout %q is not one this release reads (%s to %s): written by a newer release?", s.dir, layout, layout1, layoutVersion)
}

// ClockBound returns the clock bound persisted by SetClockBound (0 if none).
func (s *Store) ClockBound() (uint64, error) {
	v, closer, err := s.db.Get([]byte(clockKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read clock bound in %s: %w", s.dir, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("read clock bound in %s: %d bytes, want 8", s.dir, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// SetClockBound durably records the clock's upper bound. It is always
// synced: the bound must be on disk before any version above the previous
// one is used.
func (s *Store) SetClockBound(bound uint64) error {
	if err := s.write(func() error {
		return s.db.Set([]byte(clockKey), binary.BigEndian.AppendUint64(nil, bound), pebble.Sync)
	}); err != nil {
		return fmt.Errorf("write clock bound in %s: %w", s.dir, err)
	}
	return nil
}

// Close flushes nothing extra (the WAL already holds every write) and
// releases the database. A store that failed (Failure) is closed only as
// far as Pebble manages within closeWait: a fatal error can leave it
// holding a lock its Close waits for, and then it is left to the
// process's exit, which loses nothing the disk had.
func (s *Store) Close() error {
	failure := s.Failure()
	if failure == nil {
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("close store %s: %w", s.dir, err)
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("pebble panicked: %v", r)
			}
		}()
		done <- s.db.Close()
	}()
	t := time.NewTimer(s.closeWait)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("close store %s after it failed (%v): %w", s.dir, failure, err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("close store %s: Pebble did not close within %v after the store failed (%v); left to the process's exit", s.dir, s.closeWait, failure)
	}
}

// closeWaitAfterFailure is Store.closeWait: how long Close waits for
// Pebble to close a store that failed.
const closeWaitAfterFailure = 5 * time.Second

// lookup reads key's stored envelope and hands it to fn, which must not
// keep it: the bytes belong to Pebble until lookup returns. found is false
// when the key was never written. AppendEnvelope and Version share it so
// that the data-key encoding and the not-found rule have one home.
func (s *Store) lookup(key []byte, fn func(env []byte) error) (found bool, err error) {
	bp := s.keyBufs.Get().(*[]byte)
	*bp = append(append((*bp)[:0], dataPrefix), key...)
	v, closer, err := s.db.Get(*bp)
	s.keyBufs.Put(bp)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %q: %w", key, err)
	}
	defer closer.Close()
	if err := fn(v); err != nil {
		return false, fmt.Errorf("get %q: %w", key, err)
	}
	return true, nil
}

// AppendEnvelope returns a new buffer holding prefix followed by key's
// record envelope, sized exactly (the read cache keeps it as it is). found
// is false, and the buffer nil, if the key was never written.
func (s *Store) AppendEnvelope(prefix, key []byte) (buf []byte, found bool, err error) {
	found, err = s.lookup(key, func(env []byte) error {
		if _, err := record.Decode(env); err != nil {
			return err
		}
		buf = make([]byte, len(prefix)+len(env))
		copy(buf, prefix)
		copy(buf[len(prefix):], env)
		return nil
	})
	if err != nil || !found {
		return nil, false, err
	}
	return buf, true, nil
}

// Version returns the version key currently holds (found false if the key
// was never written), reading only the envelope's header.
func (s *Store) Version(key []byte) (v uint64, found bool, err error) {
	found, err = s.lookup(key, func(env []byte) error {
		var ok bool
		if v, ok = record.PeekVersion(env); !ok {
			return record.ErrCorrupt
		}
		return nil
	})
	return v, found, err
}

// Apply stores rec under key unless the key already holds a newer version
// (last-write-wins, resolved by the merge operator) or rec's version is
// below the garbage-collection horizon of key's partition while the key
// holds nothing (gc.go: such a write could bring back what a collected
// tombstone deleted, and is dropped). It returns
// once the write is durable (Sync) or in the memtable (no Sync).
func (s *Store) Apply(key []byte, rec *record.Record) error {
	return s.ApplyBatch([]Write{{Key: key, Rec: rec}})
}

// Write is one record to store under a key.
type Write struct {
	Key []byte
	Rec *record.Record
}

// ApplyBatch applies every write as Apply does, in one Pebble batch: one
// commit, and with Sync one shared fsync. The batch is atomic; two writes
// of one key resolve by version like any others.
func (s *Store) ApplyBatch(ws []Write) error {
	if err := s.admit(batchBytes(ws)); err != nil {
		return fmt.Errorf("apply batch of %d: %w", len(ws), err)
	}
	// Shared with other writers, exclusive with a collection, which
	// reads a record and deletes it only if it is still what it read.
	s.gc.mu.RLock()
	defer s.gc.mu.RUnlock()
	arrived := uint64(time.Now().UnixMilli())
	b := s.db.NewBatch()
	defer b.Close()
	n := 0
	for _, w := range ws {
		part, seg := partition.Of(w.Key)
		if below, err := s.belowHorizon(w.Key, part, w.Rec.Version); err != nil {
			return fmt.Errorf("apply batch: %w", err)
		} else if below {
			continue
		}
		if err := addMergeIn(b, w.Key, part, seg, w.Rec, arrived); err != nil {
			return fmt.Errorf("apply batch: %w", err)
		}
		s.gc.writes[part].Add(1) // before the commit: see Collect
		n++
	}
	if n == 0 {
		return nil
	}
	if err := s.write(func() error { return s.db.Apply(b, s.writeOpt) }); err != nil {
		return fmt.Errorf("apply batch of %d: %w", len(ws), err)
	}
	for _, w := range ws { // after the commit: see summary.touch
		part, _ := partition.Of(w.Key)
		s.summary.touch(part)
	}
	return nil
}

// addMerge adds rec under key's data key to b, encoding in place, and the
// key's entry to the anti-entropy index, arrived at arrived (Unix ms); it
// returns key's partition.
func addMerge(b *pebble.Batch, key []byte, rec *record.Record, arrived uint64) (partition.ID, error) {
	part, seg := partition.Of(key)
	return part, addMergeIn(b, key, part, seg, rec, arrived)
}

// addMergeIn is addMerge for a key whose partition and segment the caller
// has (partition.Of).
func addMergeIn(b *pebble.Batch, key []byte, part partition.ID, seg uint8, rec *record.Record, arrived uint64) error {
	op := b.MergeDeferred(1+len(key), rec.EncodedSize())
	op.Key[0] = dataPrefix
	copy(op.Key[1:], key)
	rec.AppendEncode(op.Value[:0])
	if err := op.Finish(); err != nil {
		return err
	}
	return addIndexIn(b, key, part, seg, indexEntryOf(rec, arrived))
}

// batchBytes is about what ws adds to the store: keys, values, the
// envelopes' and index entries' few bytes.
func batchBytes(ws []Write) int {
	n := 0
	for _, w := range ws {
		n += 2*len(w.Key) + len(w.Rec.Value) + 48
	}
	return n
}

// admit lets a write that grows the store by about n bytes go to Pebble,
// or refuses it (ErrInsufficientStorage): the store failed a write, or
// its volume is below --min-free-space (space.go). It counts refusals.
func (s *Store) admit(n int) error {
	if err := s.Failure(); err != nil {
		s.health.refusedFailed.Add(1)
		return err
	}
	if err := s.guard.admit(n); err != nil {
		s.health.refusedFull.Add(1)
		return err
	}
	return nil
}

// CheckWrite reports whether the store takes writes now, as a write of
// a record would find it: nil, or the reason it refuses them (wrapping
// ErrInsufficientStorage), counted as a refused write. A coordinator asks
// before it takes a client's write.
func (s *Store) CheckWrite() error { return s.admit(0) }

// Writable is CheckWrite without counting a refusal: for work that asks
// before it tries, and skips what would be refused (anti-entropy's
// pulls).
func (s *Store) Writable() error {
	if err := s.Failure(); err != nil {
		return err
	}
	return s.guard.admit(0)
}
