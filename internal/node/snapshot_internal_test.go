package node

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type checkpointFunc func(dir string) error

func (f checkpointFunc) Checkpoint(dir string) (time.Time, error) { return time.Time{}, f(dir) }

// TestCheckpointsGuard: closing the guard (the store is about to close)
// refuses new checkpoints and returns only once the running one has
// ended; a store without Checkpoint has no guard, and closing none is a
// no-op.
func TestCheckpointsGuard(t *testing.T) {
	require.Nil(t, newCheckpoints(struct{}{}))
	var none *checkpoints
	none.close()

	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var finished atomic.Bool
	c := newCheckpoints(checkpointFunc(func(string) error {
		blocked := false
		once.Do(func() { blocked = true })
		if blocked { // the first checkpoint runs until released
			close(started)
			<-release
			finished.Store(true)
		}
		return nil
	}))
	require.NotNil(t, c)
	first := make(chan error, 1)
	go func() { _, err := c.Checkpoint("a"); first <- err }()
	<-started
	closed := make(chan struct{})
	go func() {
		c.close()
		close(closed)
	}()
	require.Eventually(t, func() bool { _, err := c.Checkpoint("b"); return errors.Is(err, ErrStopping) }, 5*time.Second, time.Millisecond,
		"checkpoints refused once closing")
	select {
	case <-closed:
		t.Fatal("close returned while a checkpoint was running")
	default:
	}
	close(release)
	<-closed
	assert.True(t, finished.Load(), "close returned after the running checkpoint")
	require.NoError(t, <-first)
}
