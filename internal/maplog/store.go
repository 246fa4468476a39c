package maplog

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// Store keeps what raft persists, in a Pebble instance of its own under
// the log's directory: the log entries (raft.LogStore), the vote and term
// (raft.StableStore) and the snapshots (raft.SnapshotStore). Every write
// is committed with pebble.Sync before it returns: raft treats a returned
// StoreLogs, Set or snapshot Close as durable (a vote or an entry it
// acknowledged must survive a crash, or two leaders can be elected in one
// term).
//
// It is not the node's data store: the node's scans, anti-entropy,
// garbage collection and drops walk that store's key prefixes, its disk
// guard refuses writes when space runs low (which must not stop the
// membership change that would relieve it), and its WAL carries the data
// path's group commits, which raft's fsync per entry would join.
//
// Keys, each prefixed by one byte:
//
//	'l' index (8 bytes, big endian)   a log entry (encodeLog)
//	's' key                           a stable-store value
//	'm' index term (8+8 bytes)        a snapshot's metadata (JSON)
//	'd' index term                    a snapshot's data
//
// Snapshots sort by index then term, so the newest is the last key.
type Store struct {
	db *pebble.DB
	// retain is how many snapshots are kept; older ones are deleted when
	// a new one is stored.
	retain int
	// maxSnapshot bounds a snapshot's bytes: a leader streams its
	// snapshot to a follower, which buffers it whole before storing it.
	maxSnapshot int64
	mu          sync.Mutex // serializes snapshot writes (Close and its pruning)
}

const (
	prefixLog      = 'l'
	prefixStable   = 's'
	prefixSnapMeta = 'm'
	prefixSnapData = 'd'
)

// OpenStore opens (creating if needed) the store in dir on fs; Pebble
// logs to log.
func OpenStore(fs vfs.FS, dir string, retain int, maxSnapshot int64, log *slog.Logger) (*Store, error) {
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("maplog: create %s: %w", dir, err)
	}
	db, err := pebble.Open(dir, &pebble.Options{
		FS: fs,
		// The log is a few entries a change; a small memtable keeps the
		// instance's memory small beside the data store's.
		MemTableSize: 1 << 20,
		Logger:       pebbleLogger{log.With("component", "maplog.pebble")},
	})
	if err != nil {
		return nil, fmt.Errorf("maplog: open store %s: %w", dir, err)
	}
	return &Store{db: db, retain: max(retain, 1), maxSnapshot: maxSnapshot}, nil
}

// Close closes the Pebble instance.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("maplog: close store: %w", err)
	}
	return nil
}

// pebbleLogger is Pebble's logger: Infof at debug level, Errorf at error
// level. Fatalf, which Pebble calls when it cannot go on (a failed WAL or
// MANIFEST write), stops the process after logging: Pebble's code after
// it assumes it does not return, and raft treats a failed durable write
// of its log or vote as fatal as well; a restart recovers the last state
// that was synced.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any)  { p.l.Debug(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Error(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic("maplog: " + msg)
}

func logKey(index uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefixLog
	binary.BigEndian.PutUint64(k[1:], index)
	return k
}

// encodeLog lays out an entry: term, type, appended-at (Unix nanoseconds),
// then the data and the extensions, each after its length (uvarint).
func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 17+2*binary.MaxVarintLen64+len(l.Data)+len(l.Extensions))
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return b
}

// decodeLog fills l from an encoded entry; the slices it sets are copies.
func decodeLog(index uint64, b []byte, l *raft.Log) error {
	if len(b) < 17 {
		return fmt.Errorf("maplog: log entry %d: %d bytes, too short", index, len(b))
	}
	l.Index = index
	l.Term = binary.BigEndian.Uint64(b)
	l.Type = raft.LogType(b[8])
	l.AppendedAt = time.Time{}
	if at := int64(binary.BigEndian.Uint64(b[9:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	b = b[17:]
	var err error
	if l.Data, b, err = chunk(b); err != nil {
		return fmt.Errorf("maplog: log entry %d: data: %w", index, err)
	}
	if l.Extensions, b, err = chunk(b); err != nil {
		return fmt.Errorf("maplog: log entry %d: extensions: %w", index, err)
	}
	if len(b) != 0 {
		return fmt.Errorf("maplog: log entry %d: %d trailing bytes", index, len(b))
	}
	return nil
}

func chunk(b []byte) (out, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, errors.New("bad length")
	}
	if n == 0 {
		return nil, b[k:], nil
	}
	return bytes.Clone(b[k : k+int(n)]), b[k+int(n):], nil
}

// FirstIndex implements raft.LogStore: the first entry's index, 0 if none.
func (s *Store) FirstIndex() (uint64, error) { return s.edgeIndex(true) }

// LastIndex implements raft.LogStore: the last entry's index, 0 if none.
func (s *Store) LastIndex() (uint64, error) { return s.edgeIndex(false) }

func (s *Store) edgeIndex(first bool) (uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLog}, UpperBound: []byte{prefixLog + 1}})
	if err != nil {
		return 0, fmt.Errorf("maplog: log index: %w", err)
	}
	defer it.Close()
	var ok bool
	if first {
		ok = it.First()
	} else {
		ok = it.Last()
	}
	if !ok {
		return 0, it.Error()
	}
	return binary.BigEndian.Uint64(it.Key()[1:]), nil
}

// GetLog implements raft.LogStore; raft.ErrLogNotFound when absent.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("maplog: get log %d: %w", index, err)
	}
	defer closer.Close()
	return decodeLog(index, v, l)
}

// StoreLog implements raft.LogStore.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: every entry in one synced batch.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	b := s.db.NewBatch()
	defer b.Close()
	for _, l := range logs {
		if err := b.Set(logKey(l.Index), encodeLog(l), nil); err != nil {
			return fmt.Errorf("maplog: store log %d: %w", l.Index, err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("maplog: store %d log entries: %w", len(logs), err)
	}
	return nil
}

// DeleteRange implements raft.LogStore: deletes entries min..max, both
// included, durably.
func (s *Store) DeleteRange(lo, hi uint64) error {
	if hi < lo {
		return nil
	}
	end := []byte{prefixLog + 1}
	if hi < ^uint64(0) {
		end = logKey(hi + 1)
	}
	if err := s.db.DeleteRange(logKey(lo), end, pebble.Sync); err != nil {
		return fmt.Errorf("maplog: delete log %d..%d: %w", lo, hi, err)
	}
	return nil
}

func stableKey(k []byte) []byte { return append([]byte{prefixStable}, k...) }

// Set implements raft.StableStore.
func (s *Store) Set(k, v []byte) error {
	if err := s.db.Set(stableKey(k), v, pebble.Sync); err != nil {
		return fmt.Errorf("maplog: set %q: %w", k, err)
	}
	return nil
}

// Get implements raft.StableStore: an empty value when k is absent.
func (s *Store) Get(k []byte) ([]byte, error) {
	v, closer, err := s.db.Get(stableKey(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("maplog: get %q: %w", k, err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// SetUint64 implements raft.StableStore.
func (s *Store) SetUint64(k []byte, v uint64) error {
	return s.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

// GetUint64 implements raft.StableStore: 0 when k is absent.
func (s *Store) GetUint64(k []byte) (uint64, error) {
	v, err := s.Get(k)
	if err != nil || len(v) == 0 {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("maplog: %q: %d bytes, not a uint64", k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func snapKey(prefix byte, index, term uint64) []byte {
	k := make([]byte, 17)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], index)
	binary.BigEndian.PutUint64(k[9:], term)
	return k
}

func snapID(index, term uint64) string { return fmt.Sprintf("%d-%d", index, term) }

// Create implements raft.SnapshotStore. The sink buffers the snapshot and
// stores it, data and metadata in one synced batch, on Close: a snapshot
// is there whole or not at all, and a cancelled one leaves nothing.
func (s *Store) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration, confIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	if version != 1 {
		return nil, fmt.Errorf("maplog: snapshot version %d not supported", version)
	}
	return &snapSink{s: s, meta: raft.SnapshotMeta{
		Version: version, ID: snapID(index, term), Index: index, Term: term,
		Configuration: conf, ConfigurationIndex: confIndex,
	}}, nil
}

// List implements raft.SnapshotStore: the snapshots kept, newest first.
func (s *Store) List() ([]*raft.SnapshotMeta, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixSnapMeta}, UpperBound: []byte{prefixSnapMeta + 1}})
	if err != nil {
		return nil, fmt.Errorf("maplog: list snapshots: %w", err)
	}
	defer it.Close()
	var out []*raft.SnapshotMeta
	for ok := it.Last(); ok; ok = it.Prev() {
		var m raft.SnapshotMeta
		if err := json.Unmarshal(it.Value(), &m); err != nil {
			return nil, fmt.Errorf("maplog: snapshot metadata %x: %w", it.Key(), err)
		}
		out = append(out, &m)
	}
	return out, it.Error()
}

// Open implements raft.SnapshotStore.
func (s *Store) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	metas, err := s.List()
	if err != nil {
		return nil, nil, err
	}
	i := slices.IndexFunc(metas, func(m *raft.SnapshotMeta) bool { return m.ID == id })
	if i < 0 {
		return nil, nil, fmt.Errorf("maplog: snapshot %s not found", id)
	}
	m := metas[i]
	v, closer, err := s.db.Get(snapKey(prefixSnapData, m.Index, m.Term))
	if err != nil {
		return nil, nil, fmt.Errorf("maplog: open snapshot %s: %w", id, err)
	}
	defer closer.Close()
	return m, io.NopCloser(bytes.NewReader(bytes.Clone(v))), nil
}

type snapSink struct {
	s      *Store
	meta   raft.SnapshotMeta
	buf    bytes.Buffer
	closed bool
}

func (k *snapSink) ID() string { return k.meta.ID }

func (k *snapSink) Write(p []byte) (int, error) {
	if k.closed {
		return 0, errors.New("maplog: snapshot sink closed")
	}
	if int64(k.buf.Len()+len(p)) > k.s.maxSnapshot {
		return 0, fmt.Errorf("maplog: snapshot %s over %d bytes (--maplog-max-snapshot-bytes)", k.meta.ID, k.s.maxSnapshot)
	}
	return k.buf.Write(p)
}

func (k *snapSink) Cancel() error {
	k.closed = true
	k.buf = bytes.Buffer{}
	return nil
}

// Close stores the snapshot, then deletes all but the newest retain.
func (k *snapSink) Close() error {
	if k.closed {
		return nil
	}
	k.closed = true
	k.meta.Size = int64(k.buf.Len())
	meta, err := json.Marshal(&k.meta)
	if err != nil {
		return fmt.Errorf("maplog: snapshot %s metadata: %w", k.meta.ID, err)
	}
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	if err := errors.Join(
		b.Set(snapKey(prefixSnapData, k.meta.Index, k.meta.Term), k.buf.Bytes(), nil),
		b.Set(snapKey(prefixSnapMeta, k.meta.Index, k.meta.Term), meta, nil),
	); err != nil {
		return fmt.Errorf("maplog: store snapshot %s: %w", k.meta.ID, err)
	}
	metas, err := s.List()
	if err != nil {
		return err
	}
	// metas are the ones stored before this one, newest first; this one
	// makes one more.
	for i, m := range metas {
		if i+1 < s.retain || m.Index > k.meta.Index || m.ID == k.meta.ID {
			continue
		}
		if err := errors.Join(
			b.Delete(snapKey(prefixSnapData, m.Index, m.Term), nil),
			b.Delete(snapKey(prefixSnapMeta, m.Index, m.Term), nil),
		); err != nil {
			return fmt.Errorf("maplog: prune snapshot %s: %w", m.ID, err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("maplog: store snapshot %s: %w", k.meta.ID, err)
	}
	return nil
}
