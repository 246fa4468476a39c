package replica_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// TestVersionFilter: Below is true only when no version at or above v was
// raised into the key's slot (or the floor); with one slot every key
// shares it, so a newer write of another key makes the answer "maybe".
func TestVersionFilter(t *testing.T) {
	f := replica.NewVersionFilter(1, 100)
	require.False(t, f.Below([]byte("a"), 100), "the floor: something stored may be 100")
	require.True(t, f.Below([]byte("a"), 101))
	f.Raise([]byte("b"), 200)
	require.False(t, f.Below([]byte("a"), 150), "b shares a's slot")
	f.Raise([]byte("a"), 120) // never lowers
	require.False(t, f.Below([]byte("a"), 150))
	require.True(t, f.Below([]byte("a"), 201))

	var none *replica.VersionFilter
	require.False(t, none.Below([]byte("a"), 1<<60), "a nil filter knows nothing")
	none.Raise([]byte("a"), 1)
}

// TestNewerVersion: the answer is the store's, filter or not, whatever the
// order of writes; with a large filter most checks do not read the store,
// and a filter whose floor is below what is stored would be wrong, which
// is why node.Start passes the clock's bound.
func TestNewerVersion(t *testing.T) {
	for _, slots := range []int{0, 1, 1 << 10} {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) {
			st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
			require.NoError(t, err)
			defer st.Close()
			r := &replica.Replica{Store: st}
			if slots > 0 {
				r.Versions = replica.NewVersionFilter(slots, 0)
			}
			apply := func(key string, v uint64) {
				require.NoError(t, r.Apply([]byte(key), &record.Record{Version: v, Value: []byte(key)}))
			}
			newer := func(key string, v uint64) uint64 {
				n, err := r.NewerVersion([]byte(key), v)
				require.NoError(t, err)
				return n
			}
			require.Zero(t, newer("k", 5), "never written")
			apply("k", 10)
			require.Zero(t, newer("k", 10), "the same write again")
			require.Zero(t, newer("k", 11))
			require.Equal(t, uint64(10), newer("k", 9))
			apply("k", 7) // older: the store keeps 10
			require.Equal(t, uint64(10), newer("k", 8))
			apply("other", 50)
			require.Zero(t, newer("k", 20))
			require.Equal(t, uint64(50), newer("other", 20))
		})
	}
}
