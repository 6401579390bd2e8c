//go:build unix

package redisrate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
)

// TestRedisRateUnderContention is the package doc's reason for a script
// of its own: github.com/go-redis/redis_rate/v10's AllowAtMost, under the
// load of TestTakeIsExact, grants less than the limit made, because each
// partial grant charges the bucket for the fraction of a token it does
// not grant: about half a token each. If this test fails, redis_rate has
// fixed that, and the reason is gone.
func TestRedisRateUnderContention(t *testing.T) {
	s := startRedis(t)
	client := newClient(t, s.addr)
	l := redis_rate.NewLimiter(client)
	limit := redis_rate.Limit{Rate: contendRate, Burst: contendBurst, Period: time.Second}
	// The server's clock bounds the tokens made within hi - lo, a few
	// round trips of TIME: on a busy machine, where they are long, that
	// can hide the loss, and the run is made again, on a bucket of its own.
	for try := 1; ; try++ {
		key := fmt.Sprint("k", try)
		c := contend(t, client, func(ctx context.Context, n int) (int, error) {
			res, err := l.AllowAtMost(ctx, key, limit, n)
			if err != nil {
				return 0, err
			}
			return res.Allowed, nil
		})
		short, want := c.lo-c.granted, c.partial/10
		t.Logf("redis_rate: %d granted at %d/s (%d partial grants of %d asks); the server's clock gives %d to %d: %d short, %.2f a partial grant",
			c.granted, contendRate, c.partial, c.asks, c.lo, c.hi, short, float64(short)/float64(c.partial))
		// TestTakeIsExact allows none below lo.
		switch {
		case short >= want:
			return
		case c.hi-c.lo < want:
			t.Fatalf("redis_rate granted %d, %d short of %d after %d partial grants: no longer short by a fraction of a token each", c.granted, short, c.lo, c.partial)
		case try == 5:
			t.Skipf("in %d runs, the server's clock never bounded the tokens made closely enough (within %d) to see a loss of %d", try, c.hi-c.lo, want)
		}
	}
}
