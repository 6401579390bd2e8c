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

// TestReserve: the reserve of each priority for buckets of a few sizes,
// capped so that a full bucket admits every priority.
func TestReserve(t *testing.T) {
	tests := []struct {
		burst float64
		want  [shedding.NumPriorities]float64 // by priority
	}{
		{1, [4]float64{0, 0, 0, 0}},
		{2, [4]float64{0, 1, 1, 1}},
		{3, [4]float64{0, 1, 2, 2}},
		{5, [4]float64{0, 1, 2, 3}},
		{16, [4]float64{0, 2, 4, 6}},
		{100, [4]float64{0, 12, 24, 36}},
	}
	for _, tt := range tests {
		step := reserveStep(tt.burst)
		for p := range shedding.NumPriorities {
			if got := reserve(shedding.Priority(p), tt.burst, step); got != tt.want[p] {
				t.Errorf("burst %v: reserve(%v) = %v, want %v", tt.burst, shedding.Priority(p), got, tt.want[p])
			}
		}
		if got := reserve(shedding.Priority(9), tt.burst, step); got != tt.want[shedding.Bulk] {
			t.Errorf("burst %v: reserve(priority(9)) = %v, want Bulk's %v", tt.burst, got, tt.want[shedding.Bulk])
		}
	}
}

// TestRateLimiterPrioritySteps: a bucket of 10 per second, burst 5, over
// explicit instants. Lower priorities leave their reserve (Degraded 1,
// BestEffort 2, Bulk 3), are refused bottom-up as it drains, with the time
// until it holds their reserve and one more, and Critical takes the rest.
func TestRateLimiterPrioritySteps(t *testing.T) {
	l := newRateLimiter(policy.RateLimit{PerSecond: 10, Burst: 5})
	ms := time.Millisecond
	const (
		crit = shedding.Critical
		deg  = shedding.Degraded
		be   = shedding.BestEffort
		bulk = shedding.Bulk
	)
	type step struct {
		at     time.Duration
		p      shedding.Priority
		ok     bool
		retry  time.Duration
		tokens float64
	}
	table := []step{
		{0, bulk, true, 0, 4},                           // 5 ≥ 1+3
		{0, bulk, true, 0, 3},                           // 4 ≥ 1+3: leaves Bulk's 3
		{0, bulk, false, 100 * ms, 3},                   // 3 < 4: a token due in 100ms
		{0, be, true, 0, 2},                             // 3 ≥ 1+2
		{0, be, false, 100 * ms, 2},                     // refused before Degraded
		{0, deg, true, 0, 1},                            // 2 ≥ 1+1
		{0, deg, false, 100 * ms, 1},                    // refused before Critical
		{0, crit, true, 0, 0},                           // Critical takes the last
		{0, crit, false, 100 * ms, 0},                   // MaxWait 0: refused, as without priority
		{50 * ms, deg, false, 150 * ms, 0.5},            // needs 2: 1.5 more
		{150 * ms, be, false, 150 * ms, 1.5},            // needs 3
		{300 * ms, be, true, 0, 2},                      // 3 at 300ms
		{300 * ms, bulk, false, 200 * ms, 2},            // needs 4
		{time.Second, bulk, true, 0, 4},                 // full at 5 after 300ms, not 9
		{time.Second, shedding.Priority(7), true, 0, 3}, // beyond Bulk counts as Bulk
		{time.Second, shedding.Priority(7), false, 100 * ms, 3},
		{time.Second - 10*ms, be, true, 0, 2}, // a now in the past accrues nothing
	}
	for i, st := range table {
		now := rlStart.Add(st.at)
		ok, retry := l.AcquireFor(t.Context(), now, st.p)
		if ok != st.ok || retry != st.retry {
			t.Fatalf("step %d at %v (%v): AcquireFor = %v, %v; want %v, %v", i, st.at, st.p, ok, retry, st.ok, st.retry)
		}
		if got := l.available(now); math.Abs(got-st.tokens) > 1e-9 {
			t.Fatalf("step %d at %v (%v): tokens = %v, want %v", i, st.at, st.p, got, st.tokens)
		}
	}
}

// TestRateLimiterLowerNeverWaits: with MaxWait, a Bulk call that finds no
// token beyond its reserve is refused at once, and none is admitted while
// a Critical call waits, even once the bucket would hold Bulk's reserve
// but for the Critical call's token taken ahead.
func TestRateLimiterLowerNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(policy.RateLimit{PerSecond: 10, Burst: 5, MaxWait: time.Second})
		start := time.Now()
		for range 5 {
			if ok, _ := l.AcquireFor(t.Context(), start, shedding.Critical); !ok {
				t.Fatal("Critical refused by a full bucket")
			}
		}
		if ok, retry := l.AcquireFor(t.Context(), start, shedding.Bulk); ok || retry != 400*time.Millisecond || time.Since(start) != 0 {
			t.Fatalf("Bulk on an empty bucket: %v, %v after %v; want refused at once, 400ms", ok, retry, time.Since(start))
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var critAt time.Duration
		for range 3 { // Critical waits for the tokens due at 100, 200, 300ms
			wg.Go(func() {
				if ok, _ := l.AcquireFor(t.Context(), time.Now(), shedding.Critical); !ok {
					t.Error("Critical refused while it could wait")
				}
				mu.Lock()
				critAt = max(critAt, time.Since(start))
				mu.Unlock()
			})
		}
		synctest.Wait()
		time.Sleep(150 * time.Millisecond)
		if ok, retry := l.AcquireFor(t.Context(), time.Now(), shedding.Degraded); ok || retry != 350*time.Millisecond {
			t.Errorf("Degraded behind waiting Critical calls: %v, %v; want refused, 350ms (2 tokens at 500ms)", ok, retry)
		}
		wg.Wait()
		if critAt != 300*time.Millisecond {
			t.Fatalf("the last Critical admitted at %v, want 300ms", critAt)
		}
		time.Sleep(200 * time.Millisecond) // 2 tokens at 500ms
		if ok, _ := l.AcquireFor(t.Context(), time.Now(), shedding.Degraded); !ok {
			t.Fatal("Degraded refused by a bucket of 2")
		}
	})
}

// TestLeasePrioritySteps: the leased tokens of a Lease of 8 (a reserve
// step of one token) go bottom-up as the other bucket's do, and a lower
// call never waits for a lease that is on its way.
func TestLeasePrioritySteps(t *testing.T) {
	ms := time.Millisecond
	l := newShared(policy.RateLimit{PerSecond: 100, Lease: 8}, neverAsked{t}, nil)
	now := rlStart
	if d := l.decide(now, time.Time{}, true); d.verdict != leaseRefuse || d.ask != 8 {
		t.Fatalf("first call: %+v, want a refusal that asks for 8", d)
	}
	l.answer(now, 8, 0, nil)
	type step struct {
		p       shedding.Priority
		wait    bool // the call may wait a second
		verdict leaseVerdict
		hint    time.Duration // a refusal's
		tokens  int           // after the step
	}
	const (
		crit = shedding.Critical
		deg  = shedding.Degraded
		be   = shedding.BestEffort
		bulk = shedding.Bulk
	)
	steps := []step{
		{bulk, false, leaseAdmit, 0, 7},
		{bulk, false, leaseAdmit, 0, 6},
		{bulk, false, leaseAdmit, 0, 5},
		{bulk, false, leaseAdmit, 0, 4},       // half spent: the next lease is asked for
		{bulk, false, leaseAdmit, 0, 3},       // leaves Bulk's 3
		{bulk, true, leaseRefuse, 50 * ms, 3}, // no wait for it, though a lease is on its way; the hint is the ask's timeout
		{be, false, leaseAdmit, 0, 2},
		{be, true, leaseRefuse, 50 * ms, 2},
		{deg, false, leaseAdmit, 0, 1},
		{deg, true, leaseRefuse, 50 * ms, 1},
		{crit, false, leaseAdmit, 0, 0},
		{deg, true, leaseRefuse, 50 * ms, 0},
		{crit, true, leaseWait, 0, 0}, // Critical waits for the lease
		{crit, false, leaseRefuse, 0, 0},
	}
	for i, st := range steps {
		var until time.Time
		if st.wait {
			until = now.Add(time.Second)
		}
		d := l.decideFor(now, until, true, st.p)
		if d.verdict != st.verdict || d.retryAfter != st.hint {
			t.Fatalf("step %d (%v): verdict %v, hint %v; want %v, %v", i, st.p, d.verdict, d.retryAfter, st.verdict, st.hint)
		}
		if _, leased := l.Store(now); leased != st.tokens {
			t.Fatalf("step %d (%v): %d leased, want %d", i, st.p, leased, st.tokens)
		}
	}
	l.answer(now.Add(ms), 8, 0, nil)
	if d := l.decideFor(now.Add(ms), time.Time{}, true, bulk); d.verdict != leaseAdmit {
		t.Fatalf("Bulk after the lease: %v, want admitted", d.verdict)
	}
}

// TestSharedFallbackPriority: while the store fails with FailOpen, a lower
// call goes to the local bucket under its reserve, without waiting.
func TestSharedFallbackPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &fakeStore{down: true}
		l := newShared(policy.RateLimit{PerSecond: 10, Burst: 5, MaxWait: time.Second, FailOpen: true}, store, nil)
		ctx := context.Background()
		l.AcquireFor(ctx, time.Now(), shedding.Bulk) // the first ask fails
		synctest.Wait()
		var admitted int
		for range 5 {
			if ok, _ := l.AcquireFor(ctx, time.Now(), shedding.Bulk); ok {
				admitted++
			}
		}
		synctest.Wait()
		if admitted != 2 {
			t.Fatalf("Bulk admitted %d times by the fallback bucket of 5, want 2 (it leaves 3)", admitted)
		}
		if ok, _ := l.AcquireFor(ctx, time.Now(), shedding.Critical); !ok {
			t.Fatal("Critical refused by the fallback bucket")
		}
		time.Sleep(time.Second) // the backoff's asks end
	})
}

func TestRateLimiterPriorityAllocs(t *testing.T) {
	ctx := t.Context()
	l := newRateLimiter(policy.RateLimit{PerSecond: 1e6, Burst: 8})
	now := rlStart
	if allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if ok, _ := l.AcquireFor(ctx, now, shedding.Bulk); !ok {
			t.Fatal("refused")
		}
	}); allocs != 0 {
		t.Fatalf("Bulk admitted: %v allocs, want 0", allocs)
	}
	empty := newRateLimiter(policy.RateLimit{PerSecond: 1, Burst: 8, MaxWait: time.Second})
	for range 5 { // down to Bulk's reserve of 3
		empty.AcquireFor(ctx, rlStart, shedding.Critical)
	}
	if allocs := testing.AllocsPerRun(1000, func() {
		if ok, _ := empty.AcquireFor(ctx, rlStart, shedding.Bulk); ok {
			t.Fatal("Bulk admitted into its reserve")
		}
	}); allocs != 0 {
		t.Fatalf("Bulk refused: %v allocs, want 0", allocs)
	}
}

// TestRateLimiterHedges: a hedge leg takes a token only from a bucket full
// but for one, never leaving less than its call's reserve (at least
// Degraded's), and never waits, whatever MaxWait; for a bucket of one or
// two tokens that is a full bucket. Its hint is the time until the bucket
// holds what it needs.
func TestRateLimiterHedges(t *testing.T) {
	for _, tc := range []struct {
		burst int
		p     shedding.Priority
		need  float64
	}{
		{1, shedding.Critical, 1},
		{2, shedding.Critical, 2},
		{5, shedding.Critical, 4},
		{5, shedding.Bulk, 4},
		{10, shedding.Critical, 9},
		{10, shedding.Degraded, 9},
		{100, shedding.Critical, 99},
	} {
		l := newRateLimiter(policy.RateLimit{PerSecond: 10, Burst: tc.burst, MaxWait: time.Second})
		if got := l.hedgeNeed(max(tc.p, shedding.Degraded)); got != tc.need {
			t.Errorf("burst %d, %v: a hedge needs %v tokens, want %v", tc.burst, tc.p, got, tc.need)
		}
		// Drain to one token short of what a hedge needs, with Critical
		// calls at one instant.
		for range tc.burst - int(tc.need) + 1 {
			if ok, _ := l.AcquireFor(t.Context(), rlStart, shedding.Critical); !ok {
				t.Fatalf("burst %d: a Critical call refused by a bucket with tokens", tc.burst)
			}
		}
		ok, retry := l.AcquireHedge(t.Context(), rlStart, tc.p)
		if ok || retry != 100*time.Millisecond {
			t.Errorf("burst %d, %v: a hedge at %v tokens got %v, %v; want refused at once, a token due in 100ms",
				tc.burst, tc.p, l.available(rlStart), ok, retry)
		}
		now := rlStart.Add(100 * time.Millisecond)
		if ok, _ := l.AcquireHedge(t.Context(), now, tc.p); !ok || l.available(now) != tc.need-1 {
			t.Errorf("burst %d, %v: a hedge at %v tokens refused, or left %v", tc.burst, tc.p, tc.need, l.available(now))
		}
	}
	var off *RateLimiter
	if ok, _ := off.AcquireHedge(t.Context(), rlStart, shedding.Critical); !ok {
		t.Error("a nil RateLimiter refused a hedge")
	}
}

// TestSharedFallbackHedges: while the store fails with FailOpen, a hedge
// leg takes a token of the local bucket as it would without a store: only
// from a bucket full but for one (4 of 5), and without waiting.
func TestSharedFallbackHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &fakeStore{down: true}
		l := newShared(policy.RateLimit{PerSecond: 10, Burst: 5, MaxWait: time.Second, FailOpen: true}, store, nil)
		ctx := context.Background()
		l.AcquireHedge(ctx, time.Now(), shedding.Critical) // the first ask fails
		synctest.Wait()
		var admitted int
		for range 5 {
			if ok, _ := l.AcquireHedge(ctx, time.Now(), shedding.Critical); ok {
				admitted++
			}
		}
		synctest.Wait()
		if admitted != 2 {
			t.Fatalf("hedges admitted %d times by the fallback bucket of 5, want 2 (5 and 4 tokens)", admitted)
		}
		time.Sleep(time.Second) // the backoff's asks end
	})
}
