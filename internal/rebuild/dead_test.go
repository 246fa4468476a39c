package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/view"
)

// scriptedCopier copies from the peers up says are up, and calls step
// after each attempt (the test's script of what happens meanwhile).
type scriptedCopier struct {
	mu     sync.Mutex
	up     map[string]bool
	copied map[string]bool
	step   func(url string, attempt int)
	tries  map[string]int
}

func (c *scriptedCopier) Copy(_ context.Context, url string, _ uint64, _ *partition.Set) (partcopy.Stats, error) {
	c.mu.Lock()
	ok := c.up[url]
	if ok {
		c.copied[url] = true
	}
	c.tries[url]++
	n := c.tries[url]
	c.mu.Unlock()
	c.step(url, n)
	if !ok {
		return partcopy.Stats{}, errors.New("connection refused")
	}
	return partcopy.Stats{}, nil
}

func (c *scriptedCopier) CopyPartial(ctx context.Context, url string, e uint64, p *partition.Set) (partcopy.Stats, error) {
	return c.Copy(ctx, url, e, p)
}

func (c *scriptedCopier) hasCopied(url string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.copied[url]
}

func (c *scriptedCopier) setUp(urls ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range urls {
		c.up[u] = true
	}
}

// A member the map counts dead (a remove of it under way) is not waited
// for; but the remove may be aborted before read-new, and the member is
// then one like any other again, holding what it held: among it writes
// acknowledged by it and by this node before this node lost its disk.
// The rebuild copies from it then: before serving reads if the abort
// comes first, after if not.
func TestRebuildCopiesAPeerWhoseRemoveWasAborted(t *testing.T) {
	for _, abortAfterEnd := range []bool{false, true} {
		name := map[bool]string{false: "aborted before the rebuild ends", true: "aborted after it ends"}[abortAfterEnd]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				urls := []string{"http://a:1", "http://b:1", "http://c:1", "http://x:1"}
				const x = 3
				m0, err := clustermap.Seed(urls, 3)
				require.NoError(t, err)
				mRemove, err := m0.Remove(x, 1) // X is down: the operator removes it
				require.NoError(t, err)
				require.True(t, mRemove.Dead(x))
				mAbort, err := mRemove.Abort() // and aborts it (X is back)
				require.NoError(t, err)
				require.False(t, mAbort.Dead(x))

				peer := func(string) view.Peer { return pinged{} }
				var cur atomic.Pointer[view.View]
				cur.Store(view.New(m0, 0, urls[0], peer, time.Now()))
				abort := func() {
					cur.Store(view.New(mAbort, 0, urls[0], peer, time.Now()))
				}

				c := &scriptedCopier{up: map[string]bool{urls[1]: true}, copied: map[string]bool{}, tries: map[string]int{}}
				c.step = func(url string, attempt int) {
					switch {
					case url == urls[x] && attempt == 1:
						// X and C are down; X is removed as dead.
						cur.Store(view.New(mRemove, 0, urls[0], peer, time.Now()))
					case url == urls[2] && attempt == 2:
						// C is back; and, in the first story, X too, its
						// remove aborted.
						if abortAfterEnd {
							c.setUp(urls[2])
							return
						}
						abort()
						c.setUp(urls[x], urls[2])
					}
				}
				var done atomic.Bool
				r := New(cur.Load, c, Options{Rebuilding: true, Done: func() error { done.Store(true); return nil }}, slog.New(slog.DiscardHandler))
				r.Start()
				defer r.Close()
				time.Sleep(10 * time.Second)
				synctest.Wait()
				require.False(t, r.Rebuilding(), "the rebuild ended")
				require.True(t, done.Load())
				if abortAfterEnd {
					require.False(t, c.hasCopied(urls[x]), "X was dead when the rebuild ended")
					abort()
					c.setUp(urls[x])
					time.Sleep(10 * time.Second)
					synctest.Wait()
				}
				require.True(t, c.hasCopied(urls[x]), "X, a member again once its remove was aborted, was copied from")
				require.True(t, c.hasCopied(urls[1]) && c.hasCopied(urls[2]))
			})
		})
	}
}
