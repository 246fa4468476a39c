package faultnet

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestPassForwardsBothWays(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	l := newLink(t, echo.addr())
	require.Equal(t, "pass", l.Mode())

	c := dial(t, l.Addr())
	requireEcho(t, c, "hello")
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: many chunks, full buffers
	got, err := roundTrip(c, big, patience)
	require.NoError(t, err)
	require.Equal(t, big, got)

	n := int64(len("hello") + len(big))
	eventually(t, func() bool {
		s := l.Stats()
		return s.ToTarget == n && s.FromTarget == n
	}, "byte counters")
	s := l.Stats()
	require.EqualValues(t, 1, s.Accepted)
	require.EqualValues(t, 1, s.Active)
	require.Zero(t, s.Refused)
	require.Zero(t, s.Dropped)
}

func TestPassForwardsHalfClose(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	l := newLink(t, echo.addr())
	c := dial(t, l.Addr())
	require.NoError(t, c.SetDeadline(time.Now().Add(patience)))

	_, err := c.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	// The echo server sees the end only if the link forwarded the FIN, and
	// the client sees EOF only if the link forwarded the server's.
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "last words", string(got))

	require.NoError(t, c.Close())
	eventually(t, func() bool { return l.Stats().Active == 0 }, "connection gone")
}

func TestCutResetsOpenAndNewConnections(t *testing.T) {
	t.Parallel()
	echo, l, open := warmLink(t)

	l.Cut()
	require.Equal(t, "cut", l.Mode())
	requireBroken(t, open)

	requireRefused(t, l.Addr())
	eventually(t, func() bool { return l.Stats().Refused >= 1 }, "refused count")
	require.EqualValues(t, 1, echo.accepted.Load(), "a cut link must not dial the target")

	l.Restore()
	requireEcho(t, dial(t, l.Addr()), "after")
}

func TestBlackholeAnswersNothing(t *testing.T) {
	t.Parallel()
	const wait = 100 * time.Millisecond // how long a test waits for silence
	echo := startEcho(t)
	l := newLink(t, echo.addr())
	idle := dial(t, l.Addr())
	requireEcho(t, idle, "idle")
	busy := dial(t, l.Addr())
	requireEcho(t, busy, "busy")

	l.Blackhole()
	require.Equal(t, "blackhole", l.Mode())
	requireSilent(t, busy, wait)

	// New connections are accepted, read and dropped, and never reach the
	// target.
	before := l.Stats().Accepted
	fresh := dial(t, l.Addr())
	quiet := dial(t, l.Addr()) // sends nothing until the link heals
	eventually(t, func() bool { return l.Stats().Accepted == before+2 }, "accepted while blackholed")
	requireSilent(t, fresh, wait)
	eventually(t, func() bool { return l.Stats().Dropped >= 2*int64(len("ping")) }, "dropped bytes")
	require.EqualValues(t, 2, echo.accepted.Load(), "a blackholed link must not dial the target")

	l.Restore()
	// Streams with a gap are reset; the idle ones carry on, the one opened
	// in the blackhole reaching the target only now.
	requireBroken(t, busy)
	requireBroken(t, fresh)
	requireEcho(t, idle, "still here")
	requireEcho(t, quiet, "dialed at last")
	require.EqualValues(t, 3, echo.accepted.Load())
	requireEcho(t, dial(t, l.Addr()), "after")
}

func TestBlackholeHidesADeadTarget(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	l := newLink(t, echo.addr())
	echo.close()

	requireRefused(t, l.Addr()) // pass: the failed dial shows as a reset
	l.Blackhole()
	requireSilent(t, dial(t, l.Addr()), 100*time.Millisecond)
}

func TestDelayDelaysEachDirectionInOrder(t *testing.T) {
	t.Parallel()
	const d = 50 * time.Millisecond
	_, l, c := warmLink(t)

	l.Delay(d)
	require.Equal(t, "delay 50ms", l.Mode())
	start := time.Now()
	requireEcho(t, c, "slow")
	// The request waits d on the way in and the echo d on the way out.
	require.GreaterOrEqual(t, time.Since(start), 2*d)

	// Many small writes arrive in order and intact.
	var want bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&want, "message %d;", i)
	}
	require.NoError(t, c.SetDeadline(time.Now().Add(patience)))
	var wg sync.WaitGroup
	wg.Go(func() {
		msgs := bytes.SplitAfter(want.Bytes(), []byte(";"))
		for _, m := range msgs {
			if _, err := c.Write(m); err != nil {
				return
			}
		}
	})
	got := make([]byte, want.Len())
	_, err := io.ReadFull(c, got)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, want.String(), string(got))

	l.Restore()
	requireEcho(t, c, "fast again")
}

func TestModeChangeReachesQueuedChunks(t *testing.T) {
	t.Parallel()
	_, l, c := warmLink(t)

	l.Delay(time.Hour)
	_, err := c.Write([]byte("held"))
	require.NoError(t, err)
	eventually(t, func() bool { return l.Stats().Buffered == int64(len("held")) }, "chunk queued")
	l.Restore() // releases the chunk now, not in an hour
	require.NoError(t, c.SetReadDeadline(time.Now().Add(patience)))
	got := make([]byte, len("held"))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "held", string(got))

	l.Delay(time.Hour)
	_, err = c.Write([]byte("lost"))
	require.NoError(t, err)
	eventually(t, func() bool { return l.Stats().Buffered == int64(len("lost")) }, "chunk queued")
	l.Blackhole() // the queued chunk is dropped, not forwarded
	eventually(t, func() bool { return l.Stats().Dropped == int64(len("lost")) }, "chunk dropped")
	l.Restore()
	requireBroken(t, c)
}

func TestDelayAppliesBackpressure(t *testing.T) {
	t.Parallel()
	_, l, c := warmLink(t, BufferBytes(32<<10))
	l.Delay(time.Hour)

	// 64 MiB is far more than the loopback socket buffers and the link's
	// bound together, so the writer must block, not complete.
	done := make(chan struct{})
	go func() {
		defer close(done)
		block := make([]byte, 1<<20)
		for range 64 {
			if _, err := c.Write(block); err != nil {
				return
			}
		}
	}()
	eventually(t, func() bool { return l.Stats().Buffered >= chunkSize }, "link reading")
	require.Never(t, func() bool { return l.Stats().Buffered > l.cfg.maxHeld() },
		200*time.Millisecond, 5*time.Millisecond, "held bytes beyond the bound")
	select {
	case <-done:
		t.Fatal("64 MiB went into a link delayed by an hour: no backpressure")
	default:
	}
	require.NoError(t, l.Close()) // unblocks the writer with a reset
	<-done
	require.Zero(t, l.Stats().Buffered)
}

func TestMaxConnsRefusesBeyondTheCap(t *testing.T) {
	t.Parallel()
	_, l, c1 := warmLink(t, MaxConns(2))
	requireEcho(t, dial(t, l.Addr()), "two")

	requireRefused(t, l.Addr())
	eventually(t, func() bool { return l.Stats().Refused == 1 }, "refused count")

	require.NoError(t, c1.Close())
	eventually(t, func() bool { return l.Stats().Active == 1 }, "slot freed")
	requireEcho(t, dial(t, l.Addr()), "three")
}

// TestCloseReleasesEverything is not parallel: goleak checks the goroutines
// of the whole process.
func TestCloseReleasesEverything(t *testing.T) {
	echo := startEcho(t)
	ignore := goleak.IgnoreCurrent()
	l, err := NewLink(echo.addr())
	require.NoError(t, err)

	// One connection in each state a Close has to tear down: passing,
	// holding delayed data, and blackholed before its dial.
	passing := dial(t, l.Addr())
	requireEcho(t, passing, "pass")
	delayed := dial(t, l.Addr())
	requireEcho(t, delayed, "delay")
	l.Delay(time.Hour)
	_, err = delayed.Write([]byte("queued"))
	require.NoError(t, err)
	eventually(t, func() bool { return l.Stats().Buffered > 0 }, "chunk queued")
	l.Blackhole()
	holed := dial(t, l.Addr())
	_, err = holed.Write([]byte("dropped"))
	require.NoError(t, err)
	eventually(t, func() bool { return l.Stats().Accepted == 3 }, "third connection accepted")

	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	for _, c := range []net.Conn{passing, delayed, holed} {
		requireBroken(t, c)
	}
	s := l.Stats()
	require.Zero(t, s.Active)
	require.Zero(t, s.Buffered)
	_, err = net.DialTimeout("tcp", l.Addr(), patience)
	require.Error(t, err, "a closed link must not listen")
	goleak.VerifyNone(t, ignore)
}

// TestModeFlipsUnderLoad switches modes at random while clients make round
// trips with random payloads. Whatever fails, no round trip may return
// anything but its own payload: a dropped, delayed or reset chunk must never
// show up as a corrupt stream. Then the link heals and serves again.
func TestModeFlipsUnderLoad(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	l := newLink(t, echo.addr(), MaxConns(8), BufferBytes(64<<10))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okTrips, failedTrips atomic.Int64
	for i := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			var c net.Conn
			defer func() {
				if c != nil {
					_ = c.Close()
				}
			}()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if c == nil {
					var err error
					if c, err = net.DialTimeout("tcp", l.Addr(), patience); err != nil {
						continue
					}
				}
				msg := make([]byte, 1+rng.IntN(64<<10))
				for j := range msg {
					msg[j] = byte(rng.Uint32())
				}
				got, err := roundTrip(c, msg, 50*time.Millisecond)
				if err != nil {
					failedTrips.Add(1)
					_ = c.Close()
					c = nil
					continue
				}
				okTrips.Add(1)
				if !bytes.Equal(msg, got) {
					t.Errorf("client %d trip %d: corrupt echo", i, n)
					return
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 60 {
		switch rng.IntN(4) {
		case 0:
			l.Pass()
		case 1:
			l.Cut()
		case 2:
			l.Blackhole()
		case 3:
			l.Delay(time.Duration(1+rng.IntN(20)) * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(8)) * time.Millisecond) // pacing the nemesis
	}
	l.Restore()
	close(stop)
	wg.Wait()
	requireEcho(t, dial(t, l.Addr()), "healed")
	t.Logf("%d round trips succeeded, %d failed; %+v", okTrips.Load(), failedTrips.Load(), l.Stats())
}
