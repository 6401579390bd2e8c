package gate

import (
	"context"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// BenchmarkThrottlerAdmitDone is one attempt through a throttler whose
// backend accepts everything: p is 0, the common case.
func BenchmarkThrottlerAdmitDone(b *testing.B) {
	th := newThrottler(policy.Throttler{}, time.Now(), 1)
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		if d := th.Admit(now, shedding.Degraded, "acme"); !d.OK {
			b.Fatal("refused")
		}
		th.Done(now, policy.Success, true, nil)
	}
}

// BenchmarkThrottlerAdmitDoneShedding is the path under pressure: the
// backend accepts a quarter of the attempts, so every Admit splits p by
// priority, weighs the tenant and draws.
func BenchmarkThrottlerAdmitDoneShedding(b *testing.B) {
	th := newThrottler(policy.Throttler{}, time.Now(), 1)
	tenants := [...]string{"acme", "globex", "initech", "acme"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now := time.Now()
		d := th.Admit(now, shedding.Priority(i%shedding.NumPriorities), tenants[i%len(tenants)])
		if d.OK {
			th.Done(now, policy.Success, i%4 == 0, nil)
		}
		i++
	}
}

// BenchmarkThrottlerAdmitDoneParallel is the common case under contention:
// every goroutine shares one throttler, as the calls of one scope do.
func BenchmarkThrottlerAdmitDoneParallel(b *testing.B) {
	th := newThrottler(policy.Throttler{}, time.Now(), 1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now()
			if d := th.Admit(now, shedding.Degraded, "acme"); d.OK {
				th.Done(now, policy.Success, true, nil)
			}
		}
	})
}

// BenchmarkLimiterAcquireRelease is the fast path: below the limit, one
// acquire and one release with its latency, which also learns.
func BenchmarkLimiterAcquireRelease(b *testing.B) {
	l := newLimiter(policy.Limiter{}, time.Now())
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		p, d := l.Acquire(ctx, now, shedding.Degraded, "acme")
		if !d.OK {
			b.Fatal("refused")
		}
		l.Release(p, now, time.Millisecond, policy.Success)
	}
}

// BenchmarkLimiterAcquireReleaseParallel is the limiter under contention:
// every goroutine shares one limiter with a limit above the goroutines, so
// nobody waits.
func BenchmarkLimiterAcquireReleaseParallel(b *testing.B) {
	l := newLimiter(policy.Limiter{InitialLimit: 1000, MinLimit: 1000, MaxLimit: 1000}, time.Now())
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now()
			p, d := l.Acquire(ctx, now, shedding.Degraded, "acme")
			if !d.OK {
				b.Error("refused")
				return
			}
			l.Release(p, now, time.Millisecond, policy.Success)
		}
	})
}

// BenchmarkLimiterSaturated is the limiter at its limit with a queue: each
// goroutine holds a slot briefly, so arrivals queue, are handed slots,
// and, at a full queue, are refused. Waiting allocates; the rest does not.
func BenchmarkLimiterSaturated(b *testing.B) {
	l := newLimiter(policy.Limiter{InitialLimit: 4, MinLimit: 4, MaxLimit: 4, QueueFactor: 1}, time.Now())
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			now := time.Now()
			p, d := l.Acquire(ctx, now, shedding.Priority(i%shedding.NumPriorities), "acme")
			i++
			if d.OK {
				l.Release(p, now, time.Millisecond, policy.Success)
			}
		}
	})
}
