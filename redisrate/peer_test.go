//go:build unix

package redisrate

import (
	"context"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
)

// TestRedisRateUnderContention is the package doc's reason for a script
// of its own: github.com/go-redis/redis_rate/v10's AllowAtMost, under the
// load of TestTakeIsExact, grants several percent less than the limit,
// because each partial grant charges the bucket for the fraction of a
// token it does not grant. If this test fails, redis_rate has fixed that,
// and the reason is gone.
func TestRedisRateUnderContention(t *testing.T) {
	s := startRedis(t)
	l := redis_rate.NewLimiter(newClient(t, s.addr))
	limit := redis_rate.Limit{Rate: contendRate, Burst: contendBurst, Period: time.Second}
	c := contend(t, func(ctx context.Context, n int) (int, error) {
		res, err := l.AllowAtMost(ctx, "k", limit, n)
		if err != nil {
			return 0, err
		}
		return res.Allowed, nil
	})
	short := 100 * float64(c.lo-c.granted) / float64(c.lo)
	t.Logf("redis_rate: %d granted at %d/s with burst %d (%d partial grants); the clock gives %d to %d: %.1f%% short",
		c.granted, contendRate, contendBurst, c.partial, c.lo, c.hi, short)
	// TestTakeIsExact allows two asks' worth below lo, 2.5% of it;
	// redis_rate falls 3.6–4.3% short on this project's machine.
	if short < 3 {
		t.Errorf("redis_rate granted %d, %.1f%% short of %d: no longer short by much more than TestTakeIsExact allows", c.granted, short, c.lo)
	}
}
