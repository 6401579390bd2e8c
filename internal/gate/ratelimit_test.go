package gate

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

var rlStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestRateLimiterSteps: fail fast (MaxWait 0) over explicit instants.
func TestRateLimiterSteps(t *testing.T) {
	l := newRateLimiter(policy.RateLimit{PerSecond: 10, Burst: 2})
	ms := time.Millisecond
	steps := []struct {
		at        time.Duration
		ok        bool
		retry     time.Duration
		tokensNow float64 // after the step
	}{
		{0, true, 0, 1},
		{0, true, 0, 0},
		{0, false, 100 * ms, 0},
		{50 * ms, false, 50 * ms, 0.5},
		{100 * ms, true, 0, 0},
		{100 * ms, false, 100 * ms, 0},
		{time.Second, true, 0, 1}, // full at 2 after 200ms, not 9
		{time.Second, true, 0, 0},
		{time.Second, false, 100 * ms, 0},
		{time.Second - 10*ms, false, 100 * ms, 0}, // a now in the past accrues nothing
	}
	for i, st := range steps {
		now := rlStart.Add(st.at)
		ok, retry := l.Acquire(t.Context(), now)
		if ok != st.ok || retry != st.retry {
			t.Fatalf("step %d at %v: Acquire = %v, %v; want %v, %v", i, st.at, ok, retry, st.ok, st.retry)
		}
		if got := l.available(now); math.Abs(got-st.tokensNow) > 1e-9 {
			t.Fatalf("step %d at %v: Tokens = %v, want %v", i, st.at, got, st.tokensNow)
		}
	}
}

// TestRateLimiterWait runs a second caller against an emptied bucket of
// 10 per second (a token every 100ms), in a bubble.
func TestRateLimiterWait(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		perSecond float64
		maxWait   time.Duration
		deadline  time.Duration // from the start; 0: none
		cancelAt  time.Duration // 0: never
		want      bool
		wantRetry time.Duration
		wantAfter time.Duration
	}{
		{name: "fail fast", perSecond: 10, want: false, wantRetry: 100 * ms},
		{name: "token due within MaxWait", perSecond: 10, maxWait: 200 * ms, want: true, wantAfter: 100 * ms},
		{name: "token due exactly at MaxWait", perSecond: 10, maxWait: 100 * ms, want: true, wantAfter: 100 * ms},
		{name: "token due after MaxWait", perSecond: 1, maxWait: 200 * ms, want: false, wantRetry: time.Second},
		{name: "deadline sooner than the token", perSecond: 10, maxWait: time.Second, deadline: 50 * ms, want: false, wantRetry: 100 * ms},
		{name: "deadline at the token", perSecond: 10, maxWait: time.Second, deadline: 100 * ms, want: false, wantRetry: 100 * ms},
		{name: "deadline after the token", perSecond: 10, maxWait: time.Second, deadline: 150 * ms, want: true, wantAfter: 100 * ms},
		{name: "cancelled while waiting", perSecond: 10, maxWait: time.Second, cancelAt: 30 * ms, want: false, wantAfter: 30 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newRateLimiter(policy.RateLimit{PerSecond: tt.perSecond, Burst: 1, MaxWait: tt.maxWait})
				if ok, _ := l.Acquire(t.Context(), time.Now()); !ok {
					t.Fatal("first Acquire refused")
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if tt.deadline != 0 {
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				if tt.cancelAt > 0 {
					time.AfterFunc(tt.cancelAt, cancel)
				}
				start := time.Now()
				ok, retry := l.Acquire(ctx, start)
				after := time.Since(start)
				if ok != tt.want || retry != tt.wantRetry || after != tt.wantAfter {
					t.Fatalf("Acquire = %v, %v after %v; want %v, %v after %v", ok, retry, after, tt.want, tt.wantRetry, tt.wantAfter)
				}
				// A refusal takes nothing and a cancelled wait gives its
				// token back: the bucket is where time alone puts it.
				tokens := l.available(time.Now())
				want := tt.perSecond * after.Seconds()
				if ok {
					want = 0
				}
				if math.Abs(tokens-want) > 1e-9 {
					t.Fatalf("Tokens = %v after, want %v", tokens, want)
				}
				time.Sleep(time.Second) // every AfterFunc has run
			})
		})
	}
}

// A waiter that gives up while another queued behind it keeps nothing back
// from the later waiter, and gives nothing back either: the rate is never
// exceeded.
func TestRateLimiterCancelBehindQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(policy.RateLimit{PerSecond: 10, Burst: 1, MaxWait: time.Second})
		start := time.Now()
		l.Acquire(t.Context(), start)
		ctxA, cancelA := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		var bAt time.Duration
		wg.Go(func() {
			if ok, _ := l.Acquire(ctxA, time.Now()); ok {
				t.Error("A admitted after cancel")
			}
		})
		synctest.Wait()
		wg.Go(func() {
			if ok, _ := l.Acquire(t.Context(), time.Now()); !ok {
				t.Error("B refused")
			}
			bAt = time.Since(start)
		})
		synctest.Wait()
		time.Sleep(30 * time.Millisecond)
		cancelA()
		wg.Wait()
		if bAt != 200*time.Millisecond {
			t.Fatalf("B admitted at %v, want 200ms (its place in the queue)", bAt)
		}
		if got := l.available(time.Now()); math.Abs(got) > 1e-9 {
			t.Fatalf("Tokens = %v at 200ms, want 0", got)
		}
	})
}

func TestRateLimiterAllocs(t *testing.T) {
	ctx := t.Context()
	l := newRateLimiter(policy.RateLimit{PerSecond: 1e6, Burst: 1})
	now := rlStart
	if allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if ok, _ := l.Acquire(ctx, now); !ok {
			t.Fatal("refused")
		}
	}); allocs != 0 {
		t.Fatalf("admit: %v allocs, want 0", allocs)
	}
	empty := newRateLimiter(policy.RateLimit{PerSecond: 1, Burst: 1, MaxWait: time.Millisecond})
	empty.Acquire(ctx, rlStart)
	if allocs := testing.AllocsPerRun(1000, func() {
		if ok, _ := empty.Acquire(ctx, rlStart); ok {
			t.Fatal("admitted from an empty bucket")
		}
	}); allocs != 0 {
		t.Fatalf("refusal: %v allocs, want 0", allocs)
	}
}

// Acquire is AcquireFor a Critical call, the priority of a call that
// carries none: the tests' shorthand, declared here since only they use it.
func (l *RateLimiter) Acquire(ctx context.Context, now time.Time) (ok bool, retryAfter time.Duration) {
	return l.AcquireFor(ctx, now, shedding.Critical)
}

// decide is decideFor a Critical call, the tests' shorthand as Acquire is.
func (l *RateLimiter) decide(now, waitUntil time.Time, fresh bool) leaseDecision {
	return l.decideFor(now, waitUntil, fresh, shedding.Critical)
}
