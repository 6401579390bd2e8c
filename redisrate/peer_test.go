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
	granted, want, partial := contend(t, func(ctx context.Context, n int) (int, error) {
		res, err := l.AllowAtMost(ctx, "k", limit, n)
		if err != nil {
			return 0, err
		}
		return res.Allowed, nil
	})
	short := 100 * float64(want-granted) / float64(want)
	t.Logf("redis_rate: %d granted at %d/s with burst %d (%d partial grants); the clock gives %d: %.1f%% short",
		granted, contendRate, contendBurst, partial, want, short)
	if short < 2 {
		t.Errorf("redis_rate granted %d of %d, %.1f%% short: no longer short by more than the test's slack", granted, want, short)
	}
}
