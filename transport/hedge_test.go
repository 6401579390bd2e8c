package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// slowRT is a base whose every wire call takes the latency its func says,
// honouring cancellation, then answers with a status. The func sees the
// call's index (from 0) and the request.
type slowRT struct {
	latency func(i int64, r *http.Request) (time.Duration, int)
	next    atomic.Int64 // when set, the next call's latency, answered 200
	calls   atomic.Int64
	mu      sync.Mutex
	ctxs    []context.Context
	bodies  []*body
}

func (s *slowRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	i := s.calls.Add(1) - 1
	s.mu.Lock()
	s.ctxs = append(s.ctxs, r.Context())
	s.mu.Unlock()
	d, code := s.latency(i, r)
	if n := s.next.Swap(0); n != 0 {
		d, code = time.Duration(n), 200
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	resp := respond(r, code)
	s.mu.Lock()
	s.bodies = append(s.bodies, resp.Body.(*body))
	s.mu.Unlock()
	return resp, nil
}

// slowOnce makes the next wire call take d, and answer 200.
func (s *slowRT) slowOnce(d time.Duration) { s.next.Store(int64(d)) }

// steady is a latency func for a base whose every call takes d and
// answers 200.
func steady(d time.Duration) func(int64, *http.Request) (time.Duration, int) {
	return func(int64, *http.Request) (time.Duration, int) { return d, 200 }
}

// warmThenFailSlowly answers the first 30 calls in 10ms, to warm the
// latency window, and every later one with a 503 after 100ms, slow enough
// to be hedged.
func warmThenFailSlowly(i int64, _ *http.Request) (time.Duration, int) {
	if i < 30 {
		return 10 * time.Millisecond, 200
	}
	return 100 * time.Millisecond, 503
}

// warmHedging returns a transport running set over a base whose calls
// take 10ms, with its latency window already warm (30 calls), and what its
// observer sees.
func warmHedging(t *testing.T, set policy.Set) (*Transport, *slowRT, *hedgeEvents) {
	t.Helper()
	base := &slowRT{latency: steady(10 * time.Millisecond)}
	ev := &hedgeEvents{}
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
	warm(t, tr, 30)
	return tr, base, ev
}

// hedgeEvents collects what an observer saw.
type hedgeEvents struct {
	mu         sync.Mutex
	started    int
	won        int
	suppressed map[policy.SuppressReason]int
	attempts   []policy.AttemptInfo
}

func (e *hedgeEvents) observer() *policy.Observer {
	e.suppressed = map[policy.SuppressReason]int{}
	return &policy.Observer{
		HedgeStarted: func(policy.HedgeInfo) { e.mu.Lock(); e.started++; e.mu.Unlock() },
		HedgeWon:     func(policy.HedgeInfo) { e.mu.Lock(); e.won++; e.mu.Unlock() },
		HedgeSuppressed: func(s policy.HedgeSuppression) {
			e.mu.Lock()
			e.suppressed[s.Reason]++
			e.mu.Unlock()
		},
		AttemptDone: func(a policy.AttemptInfo) { e.mu.Lock(); e.attempts = append(e.attempts, a); e.mu.Unlock() },
	}
}

func (e *hedgeEvents) counts() (started, won int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.started, e.won
}

func (e *hedgeEvents) reason(r policy.SuppressReason) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.suppressed[r]
}

// do makes one GET and reads and closes the body.
func do(t *testing.T, ctx context.Context, rt http.RoundTripper) (int, error) {
	t.Helper()
	resp, err := get(t, ctx, rt, "http://up.test/")
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// warm makes n sequential calls, so the latency window holds n samples.
func warm(t *testing.T, rt http.RoundTripper, n int) {
	t.Helper()
	for range n {
		if _, err := do(t, t.Context(), rt); err != nil {
			t.Fatal(err)
		}
	}
}

// hedgeSet hedges once per call at most: the tests that use it were
// written for two legs. TestThirdLegForTheDoublySlow covers the default's
// third.
func hedgeSet() policy.Set {
	return policy.Set{Hedge: &policy.Hedge{MaxConcurrent: 2}}
}

func TestBrownoutStopsTheHedgingItWouldOtherwiseCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var normal, slowNext atomic.Int64 // latency of ordinary calls; a one-off slow first leg
		normal.Store(int64(100 * time.Millisecond))
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			if d := slowNext.Swap(0); d != 0 {
				return time.Duration(d), 200
			}
			return time.Duration(normal.Load()), 200
		}}
		var ev hedgeEvents
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: ev.observer()})

		warm(t, tr, 100) // 500 ms is far in the tail of 100 ms calls
		slowNext.Store(int64(500 * time.Millisecond))
		warm(t, tr, 1)
		synctest.Wait() // the winning hedge's goroutine reports after the caller has its answer
		if started, won := ev.counts(); started != 1 || won != 1 {
			t.Fatalf("a 500ms call while 500ms is the tail: %d hedges started, %d won; want 1, 1", started, won)
		}

		// The brownout: 500 ms becomes the distribution. Nothing is
		// reconfigured; the window follows.
		normal.Store(int64(500 * time.Millisecond))
		before, _ := ev.counts()
		warm(t, tr, 100) // 50s of 500ms calls: more than the 30s window
		during, _ := ev.counts()
		if hedged := during - before; hedged > 10 {
			t.Fatalf("%d of 100 calls hedged while the brownout settled in; the quantile should follow it", hedged)
		}
		warm(t, tr, 1) // the identical 500 ms call
		if after, _ := ev.counts(); after != during {
			t.Fatal("the identical 500ms call was hedged once 500ms became the distribution")
		}
		if got := tr.Measured("up.test").HedgeThreshold; got < 500*time.Millisecond || got > 563*time.Millisecond {
			t.Fatalf("threshold %v, want the bucket above 500ms", got)
		}
	})
}

func TestLoserIsAborted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, base, ev := warmHedging(t, hedgeSet())
		slowOnce := func() { base.slowOnce(time.Hour) }
		slowOnce()
		start := time.Now()
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 30*time.Millisecond {
			t.Fatalf("the call took %v; the hedge should have answered", d)
		}
		loser := base.ctxs[30]
		synctest.Wait()
		if !errors.Is(context.Cause(loser), errDiscarded) {
			t.Fatalf("the losing leg's context: %v, want it cancelled as discarded", context.Cause(loser))
		}
		var discarded int
		// The winner reports the loser as discarded at the moment it
		// cancels it, on the winner's goroutine, which may be after the
		// call has returned: read under the observer's lock.
		ev.mu.Lock()
		attempts := ev.attempts
		ev.mu.Unlock()
		for _, a := range attempts {
			if a.Outcome == policy.Discarded {
				discarded++
			}
		}
		if discarded != 1 {
			t.Fatalf("%d attempts observed as discarded, want 1", discarded)
		}
	})
}

// TestLosingResponseIsClosed uses a base that answers after its latency
// whatever the context says, as a misbehaving RoundTripper would: the
// loser's response arrives after the round was won, and must be closed.
func TestLosingResponseIsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		var bodies []*body
		var mu sync.Mutex
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if n.Add(1) == 31 {
				d = 200 * time.Millisecond
			}
			time.Sleep(d) // ignores the context on purpose
			resp := respond(r, 200)
			mu.Lock()
			bodies = append(bodies, resp.Body.(*body))
			mu.Unlock()
			return resp, nil
		})
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet()})
		warm(t, tr, 30)
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		for i, b := range bodies {
			if !b.closed.Load() {
				t.Errorf("body %d left open", i)
			}
		}
		if len(bodies) != 32 {
			t.Fatalf("%d responses, want 32 (30 warm-up, the slow leg and its hedge)", len(bodies))
		}
	})
}

func TestPlainPostIsNeverHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, base, ev := warmHedging(t, hedgeSet())
		slowOnce := func() { base.slowOnce(time.Second) }
		post := func(key bool, ctx context.Context) {
			slowOnce()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://up.test/", strings.NewReader("pay=1"))
			if key {
				req.Header.Set("Idempotency-Key", "k")
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		post(false, t.Context())
		if s, _ := ev.counts(); s != 0 {
			t.Fatal("a plain POST was hedged")
		}
		post(true, t.Context())
		if s, _ := ev.counts(); s != 1 {
			t.Fatalf("a POST with an Idempotency-Key: %d hedges, want 1", s)
		}
		post(false, MarkRepeatable(t.Context()))
		if s, _ := ev.counts(); s != 2 {
			t.Fatalf("a POST marked repeatable: %d hedges in all, want 2", s)
		}
	})
}

func TestHedgesAndRetriesShareOneBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Every first leg is slow and then fails; hedges fail too. Both
		// retries and hedges want tokens; the budget holds 3 and never
		// refills (MinPerSecond < 0, Ratio tiny).
		base := &slowRT{latency: warmThenFailSlowly}
		var ev hedgeEvents
		var skips atomic.Int64
		obs := ev.observer()
		obs.RetrySkipped = func(s policy.RetrySkip) {
			if s.Reason == policy.SkipBudget {
				skips.Add(1)
			}
		}
		set := policy.Set{
			Attempts: 4,
			Retry:    &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Hedge:    &policy.Hedge{},
			Budget:   policy.Budget{Max: 3, MinPerSecond: -1, Ratio: 1e-9},
		}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: obs})
		warm(t, tr, 30)
		for range 5 {
			if _, err := do(t, t.Context(), tr); err != nil {
				t.Fatal(err)
			}
		}
		started, _ := ev.counts()
		amplification := int(base.calls.Load()) - 30 - 5 // wire calls beyond one per call
		if amplification != 3 {
			t.Fatalf("%d extra wire calls (%d of them hedges), want exactly the 3 tokens", amplification, started)
		}
		if started == 0 || ev.reason(policy.HedgeBudget)+int(skips.Load()) == 0 {
			t.Fatalf("hedges %d, budget refusals %d+%d: both amplifiers should have met the budget",
				started, ev.reason(policy.HedgeBudget), skips.Load())
		}
	})
}

func TestNoHedgeOutlivesTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: steady(100 * time.Millisecond)}
		slowOnce := func() { base.slowOnce(time.Hour) }
		var ev hedgeEvents
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: ev.observer()})
		warm(t, tr, 30) // threshold ~ 100 ms, median ~ 100 ms

		// 150 ms left: the hedge would fire at ~110 ms with ~40 ms to
		// go, less than the ~100 ms a hedge takes. It is not sent.
		slowOnce()
		ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := do(t, ctx, tr)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if d := time.Since(start); d != 150*time.Millisecond {
			t.Fatalf("returned after %v, want at the 150ms deadline", d)
		}
		if s, _ := ev.counts(); s != 0 || ev.reason(policy.HedgeDeadline) != 1 {
			t.Fatalf("hedges %d, deadline suppressions %d; want 0 and 1", s, ev.reason(policy.HedgeDeadline))
		}

		// A deadline shorter than the threshold: no timer fires at all.
		slowOnce()
		ctx2, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel2()
		if _, err := do(t, ctx2, tr); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if s, _ := ev.counts(); s != 0 {
			t.Fatal("a hedge was sent that could not finish before the deadline")
		}
		synctest.Wait()
		for i, c := range base.ctxs[30:] {
			if c.Err() == nil {
				t.Errorf("leg %d's context outlived its call", i)
			}
		}
	})
}

func TestSuppressAtStopsHedgingNearTheTripPoint(t *testing.T) {
	// 40% errors, in a pattern with no five failures in a row: the breaker
	// (trip point 0.5 before it has a baseline) stays closed, but 40% is
	// past SuppressAt (0.5) of the trip point. Without a Breaker the health
	// gate uses the breaker's defaults.
	for _, breaker := range []*policy.Breaker{{}, nil} {
		t.Run(fmt.Sprintf("breaker=%v", breaker != nil), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pattern := []int{503, 200, 503, 200, 200}
				base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
					return 10 * time.Millisecond, pattern[i%5]
				}}
				var ev hedgeEvents
				set := policy.Set{Hedge: &policy.Hedge{}, Breaker: breaker}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
				warm(t, tr, 200) // enough that 5 slow calls stay above p95
				for range 5 {
					base.slowOnce(time.Second)
					if _, err := do(t, t.Context(), tr); err != nil {
						t.Fatal(err)
					}
				}
				m := tr.Measured("up.test")
				if m.BreakerState != policy.BreakerClosed {
					t.Fatalf("breaker %v, want closed", m.BreakerState)
				}
				if s, _ := ev.counts(); s != 0 || ev.reason(policy.HedgeHealth) != 5 {
					t.Fatalf("%d hedges, %d health suppressions; want 0 and 5", s, ev.reason(policy.HedgeHealth))
				}
			})
		})
	}
}

func TestWinRateRetreatsAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Phase 1, a uniformly slow dependency: 4% of legs take 130ms
		// instead of 100ms, so a hedge sent at p95 (~100ms) needs another
		// 100ms and never beats the leg it hedges. Phase 2, one slow
		// replica: 4% of legs take a second, and a hedge sent at ~100ms
		// answers at ~200ms and wins.
		var phase atomic.Int32
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			switch {
			case i%25 != 0:
				return 100 * time.Millisecond, 200
			case phase.Load() == 1:
				return 130 * time.Millisecond, 200
			}
			return time.Second, 200
		}}
		set := policy.Set{Hedge: &policy.Hedge{Window: 10 * time.Second,
			WinRate: &policy.WinRate{Floor: 0.3, MinAllowance: 0.05, MinSamples: 5}}}
		tr := mustNew(t, Config{Base: base, Policies: set})
		// drive runs 16 callers for d and samples the allowance once a
		// second over the second half.
		drive := func(d time.Duration) (lowest, mean float64) {
			var wg sync.WaitGroup
			start := time.Now()
			stop := start.Add(d)
			for range 16 {
				wg.Go(func() {
					for time.Now().Before(stop) {
						if _, err := do(t, t.Context(), tr); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			lowest = 1
			var n int
			for now := time.Now(); now.Before(stop); now = time.Now() {
				time.Sleep(time.Second)
				if now.Sub(start) < d/2 {
					continue
				}
				a := tr.Measured("up.test").HedgeAllowance
				lowest = min(lowest, a)
				mean += a
				n++
			}
			wg.Wait()
			return lowest, mean / float64(n)
		}
		phase.Store(1)
		lowest, mean := drive(100 * time.Second)
		// AIMD with a too-few-hedges relaxation cycles shallowly near the
		// floor: down to it, then up a quarter when it starves itself of
		// evidence.
		if lowest > 0.05 || mean > 0.3 {
			t.Fatalf("uniformly slow dependency: allowance lowest %.3f, mean %.3f; want the 0.05 floor and a low mean", lowest, mean)
		}
		phase.Store(2)
		lowest, _ = drive(100 * time.Second)
		m := tr.Measured("up.test")
		if lowest < 0.99 {
			t.Fatalf("one slow replica: allowance fell to %.3f over the second half (won %d of %d), want it back at 1",
				lowest, m.HedgesWon, m.HedgesStarted)
		}
		if m.HedgesWon*2 < m.HedgesStarted {
			t.Fatalf("one slow replica: hedges won %d of %d, want most", m.HedgesWon, m.HedgesStarted)
		}
	})
}

func TestAttemptsCountsWireCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: warmThenFailSlowly}
		set := policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Hedge:    &policy.Hedge{MaxConcurrent: 3},
		}
		var attempts []policy.CallInfo
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
			CallDone: func(c policy.CallInfo) { attempts = append(attempts, c) },
		}})
		warm(t, tr, 30)
		code, err := do(t, t.Context(), tr)
		if err != nil || code != 503 {
			t.Fatalf("got %d, %v", code, err)
		}
		// One slow failing round: the first leg, a hedge at ~11ms and
		// another at ~22ms: three wire calls, and so no retry.
		if got := base.calls.Load() - 30; got != 3 {
			t.Fatalf("%d wire calls, want Attempts = 3 in all, hedges and retries together", got)
		}
		if last := attempts[len(attempts)-1]; last.WireAttempts != 3 {
			t.Fatalf("CallDone says %d wire attempts", last.WireAttempts)
		}
	})
}

func TestColdPolicyHedgesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			if i == 10 {
				return time.Minute, 200
			}
			return 10 * time.Millisecond, 200
		}}
		var ev hedgeEvents
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: ev.observer()})
		warm(t, tr, 11) // the 11th call is a minute long; 10 samples < MinSamples
		if s, _ := ev.counts(); s != 0 || ev.reason(policy.HedgeWarming) != 11 {
			t.Fatalf("%d hedges, %d warming suppressions; want 0 and 11", s, ev.reason(policy.HedgeWarming))
		}
		if tr.Measured("up.test").HedgeThreshold != 0 {
			t.Fatal("a threshold was reported below MinSamples")
		}
	})
}

func TestBulkIsNeverHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, base, ev := warmHedging(t, hedgeSet())
		slowOnce := func() { base.slowOnce(time.Second) }
		slowOnce()
		if _, err := do(t, shedding.WithPriority(t.Context(), shedding.Bulk), tr); err != nil {
			t.Fatal(err)
		}
		if s, _ := ev.counts(); s != 0 || ev.reason(policy.HedgePriority) != 1 {
			t.Fatalf("%d hedges, %d priority suppressions", s, ev.reason(policy.HedgePriority))
		}
	})
}

func TestHedgeThatFailsLetsTheFirstLegWin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			switch {
			case i < 30:
				return 10 * time.Millisecond, 200
			case i == 30:
				return 50 * time.Millisecond, 200 // slow first leg, succeeds
			}
			return time.Millisecond, 503 // the hedge fails fast
		}}
		var ev hedgeEvents
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: ev.observer()})
		warm(t, tr, 30)
		code, err := do(t, t.Context(), tr)
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; the first leg's success should win over the failed hedge", code, err)
		}
		if s, w := ev.counts(); s != 1 || w != 0 {
			t.Fatalf("started %d won %d", s, w)
		}
		synctest.Wait()
		for i, b := range base.bodies {
			if !b.closed.Load() {
				t.Errorf("body %d left open", i)
			}
		}
	})
}

// TestHedgedTailStaysInTheWindow: hedging must not change the distribution
// it measures. The slow legs it rescues are cancelled; if they vanished
// from the latency window, the window would see only fast legs, and the
// quantile would stay in the fast mode however many calls turned slow: the
// better hedging worked, the more it would hedge. They are recorded at the
// time they were cut short, a lower bound. Here 2% of legs take a second,
// then 10% do, hedged at p95: once a tenth of calls are that slow, p95 is
// no longer a fast call's latency, and the threshold must leave the fast
// mode (10-40ms) and climb toward the slow one.
func TestHedgedTailStaysInTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var every atomic.Int64
		every.Store(50)
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			if i%every.Load() == 0 {
				return time.Second, 200
			}
			return 10*time.Millisecond + time.Duration(i*7919%31)*time.Millisecond, 200
		}}
		set := policy.Set{Hedge: &policy.Hedge{Quantile: 0.95}, Budget: policy.Budget{Ratio: -1}}
		tr := mustNew(t, Config{Base: base, Policies: set})
		warm(t, tr, 500)
		calm := tr.Measured("up.test").HedgeThreshold
		every.Store(10)
		warm(t, tr, 2500) // a minute: twice the window
		slow := tr.Measured("up.test").HedgeThreshold
		t.Logf("threshold %v with 2%% slow legs, %v with 10%%", calm, slow)
		if calm > 50*time.Millisecond || slow < 100*time.Millisecond {
			t.Fatalf("threshold %v then %v: want the fast mode, then well above it", calm, slow)
		}
	})
}

// TestThirdLegForTheDoublySlow: with the default MaxConcurrent (3), a call
// whose first leg and hedge are both slow gets a third leg a threshold
// after the hedge, and the third's answer wins; with MaxConcurrent 2 the
// call waits for the slow legs. A call whose hedge answers gets no third.
func TestThirdLegForTheDoublySlow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		maxConcurrent int
		fastHedge     bool // the first hedge answers at once
		wantWire      int64
		wantStarted   int
		wantUnder     time.Duration // the call's duration, at most
		wantOver      time.Duration // and at least
	}{
		// The threshold is about 10.5 ms (the bucket above the warm
		// calls' 10 ms), and every fast leg takes 10 ms.
		{"default, both slow", 0, false, 3, 2, 35 * time.Millisecond, 30 * time.Millisecond},
		{"default, the hedge answers", 0, true, 2, 1, 25 * time.Millisecond, 20 * time.Millisecond},
		{"two legs, both slow", 2, false, 2, 1, 110 * time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
					switch {
					case i < 30, i == 31 && tc.fastHedge, i >= 32:
						return 10 * time.Millisecond, 200
					}
					return 100 * time.Millisecond, 200 // the first leg, and the first hedge unless fast
				}}
				var ev hedgeEvents
				tr := mustNew(t, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{MaxConcurrent: tc.maxConcurrent}}, Observer: ev.observer()})
				warm(t, tr, 30)
				start := time.Now()
				code, err := do(t, t.Context(), tr)
				took := time.Since(start)
				if err != nil || code != 200 {
					t.Fatalf("got %d, %v", code, err)
				}
				synctest.Wait()
				if wire := base.calls.Load() - 30; wire != tc.wantWire {
					t.Errorf("%d wire calls, want %d", wire, tc.wantWire)
				}
				if s, _ := ev.counts(); s != tc.wantStarted {
					t.Errorf("%d hedges started, want %d", s, tc.wantStarted)
				}
				if took < tc.wantOver || took > tc.wantUnder {
					t.Errorf("the call took %v, want between %v and %v", took, tc.wantOver, tc.wantUnder)
				}
			})
		})
	}
}
