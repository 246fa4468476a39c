package pace

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// A limiter with a burst of 0 (rate.NewLimiter(rate.Inf, 0), the usual
// "unlimited", or a finite rate with a burst below one byte) makes steps
// of min(n, 0) = 0 bytes: WaitN(ctx, 0) returns nil at once and the loop
// never ended. Its doc promises WaitN's error; rpc/stream.go's pacedIter
// counts on that error ("a burst below one byte leaves the record
// unpaced") and passes context.Background(): it would have spun for ever.
func TestWaitBytesZeroBurst(t *testing.T) {
	for _, l := range []*rate.Limiter{rate.NewLimiter(rate.Inf, 0), rate.NewLimiter(1000, 0)} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		_ = WaitBytes(ctx, l, 10)
		cancel()
		require.Less(t, time.Since(start), time.Second, "limit %v burst 0: WaitBytes spun until its context ended", l.Limit())
	}
}
