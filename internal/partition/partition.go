// Package partition divides the keyspace into a fixed number of partitions,
// each into a fixed number of segments, by a hash of the key.
//
// Partitions are the unit of placement (every key of a partition has the
// same replicas, package placement) and of anti-entropy (replicas compare a
// partition's summary, package store, and only then its segments and
// keys). Their number never changes with the cluster's size, so a
// membership change moves whole partitions and never rehashes a key; it is
// fixed for the life of a data directory: changing Count or the hash would
// misplace every key already stored.
//
// Count is 4096 as in Riak's Tictac trees: enough for placement to spread
// evenly over the few hundred nodes the HLC's node id allows, and few
// enough that a replica's whole summary (4096 × 8 bytes) fits one request.
// Segments splits a partition so that a difference of a few keys costs the
// listing of a few segments, not of the partition (about 4 keys a segment
// at 1M keys).
package partition

import "github.com/cespare/xxhash/v2"

const (
	// Bits is log2(Count).
	Bits = 12
	// Count is the number of partitions.
	Count = 1 << Bits
	// SegmentBits is log2(Segments).
	SegmentBits = 6
	// Segments is the number of segments in a partition.
	Segments = 1 << SegmentBits
)

// ID is a partition number, 0 to Count-1.
type ID uint16

// Of returns key's partition and its segment within the partition: the
// top Bits of xxhash64(key), then the next SegmentBits.
func Of(key []byte) (ID, uint8) {
	h := xxhash.Sum64(key)
	return ID(h >> (64 - Bits)), uint8(h>>(64-Bits-SegmentBits)) & (Segments - 1)
}

// EntryHash is what a (key, version) pair contributes to its segment's
// hash; a segment's hash is the XOR of its entries', a partition's the XOR
// of its segments'. XOR makes the summary independent of the order keys
// were written in, and lets two replicas holding the same versions of the
// same keys agree bit for bit. It is not a cryptographic hash: a client
// able to choose colliding keys can at worst hide its own keys'
// differences from one exchange.
func EntryHash(key []byte, version uint64) uint64 {
	return Mix(xxhash.Sum64(key) ^ Mix(version))
}

// Mix is splitmix64's finalizer: it spreads x's bits over all 64, so that
// hashes combined from related inputs (a key hash and a version, a
// partition and a node seed) are independent.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
