package gate

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The constructors take configs with their defaults applied, as the
// transport's compile step applies them; the tests go through these.

func newBreaker(cfg policy.Breaker, now time.Time, seed uint64) *Breaker {
	return NewBreaker(cfg.WithDefaults(), now, seed)
}

func newLimiter(cfg policy.Limiter, now time.Time) *Limiter {
	return NewLimiter(cfg.WithDefaults(), now, new(Tenants))
}

func newThrottler(cfg policy.Throttler, now time.Time, seed uint64) *Throttler {
	return NewThrottler(cfg.WithDefaults(), now, seed, new(Tenants))
}

func newBulkhead(cfg policy.Bulkhead) *Bulkhead { return NewBulkhead(cfg) }

func newBudget(cfg policy.Budget, now time.Time) *Budget {
	return NewBudget(cfg.WithDefaults(), now)
}

func newRateLimiter(cfg policy.RateLimit) *RateLimiter {
	return NewRateLimiter(cfg.WithDefaults(), "", 0, nil)
}
