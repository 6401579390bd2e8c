package gate

import (
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// BenchmarkBreakerAllowDone is one admitted call through a closed breaker:
// Allow, then Done with its outcome (one failure in ten, never a trip).
func BenchmarkBreakerAllowDone(b *testing.B) {
	br := newBreaker(policy.Breaker{}, time.Now(), 1)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now := time.Now()
		p, d := br.Allow(now)
		if !d.OK {
			b.Fatal("refused")
		}
		o := policy.Success
		if i++; i%10 == 0 {
			o = policy.Failure
		}
		br.Done(now, p, o)
	}
}

// BenchmarkBreakerAllowDoneParallel is the same under contention: every
// goroutine shares one breaker, as the calls of one scope do.
func BenchmarkBreakerAllowDoneParallel(b *testing.B) {
	br := newBreaker(policy.Breaker{}, time.Now(), 1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			now := time.Now()
			p, d := br.Allow(now)
			if !d.OK {
				b.Error("refused")
				return
			}
			o := policy.Success
			if i++; i%10 == 0 {
				o = policy.Failure
			}
			br.Done(now, p, o)
		}
	})
}

// BenchmarkBulkheadAcquireRelease is the fast path: a free slot.
func BenchmarkBulkheadAcquireRelease(b *testing.B) {
	g := newBulkhead(policy.Bulkhead{MaxConcurrent: 64, MaxWait: time.Second})
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if !g.Acquire(ctx) {
			b.Fatal("refused")
		}
		g.Release()
	}
}

// BenchmarkRateLimiterAllow is the fast path: a token in the bucket.
func BenchmarkRateLimiterAllow(b *testing.B) {
	l := newRateLimiter(policy.RateLimit{PerSecond: 1e12, Burst: 1 << 20})
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if ok, _ := l.Acquire(ctx, time.Now()); !ok {
			b.Fatal("refused")
		}
	}
}
