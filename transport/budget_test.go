package transport

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// flakyHost fails a random share of the attempts it gets by resetting the
// connection, after a latency drawn per attempt. Each call draws from a
// source of its own, seeded by the host's seed and the call's number (the
// X-Call header), so that which attempts fail does not depend on the order
// in which the calls' attempts happen to arrive.
type flakyHost struct {
	seed    uint64
	fail    float64              // share of attempts that fail
	latency httptestutil.Latency // nil: none

	wire  atomic.Int64
	mu    sync.Mutex
	draws map[string]*rand.Rand
}

func (h *flakyHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.wire.Add(1)
	id := r.Header.Get("X-Call")
	h.mu.Lock()
	rng := h.draws[id]
	if rng == nil {
		n, _ := strconv.ParseUint(id, 10, 64)
		rng = rand.New(rand.NewPCG(h.seed, n))
		h.draws[id] = rng
	}
	var d time.Duration
	if h.latency != nil {
		d = h.latency.Sample(rng)
	}
	failed := rng.Float64() < h.fail
	h.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	if failed {
		panic(http.ErrAbortHandler) // a reset connection, through InMemory
	}
	w.WriteHeader(http.StatusOK)
}

// load is what a steady stream of calls through a transport over a
// flakyHost came to.
type load struct {
	calls, ok, wire, hedges int
	took                    time.Duration
}

// drive sends calls GETs, one every interval, each on a goroutine of its
// own, and waits for all of them. It runs inside a synctest bubble.
func drive(t *testing.T, host *flakyHost, set policy.Set, calls int, interval time.Duration) load {
	t.Helper()
	host.draws = map[string]*rand.Rand{}
	var hedges atomic.Int64
	obs := &policy.Observer{HedgeStarted: func(policy.HedgeInfo) { hedges.Add(1) }}
	tr := mustNew(t, Config{Base: httptestutil.InMemory(host), Policies: set, Observer: obs})
	var ok atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range calls {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(t.Context(), "GET", "http://flaky.test/", nil)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-Call", strconv.Itoa(i))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ok.Add(1)
			}
		})
		time.Sleep(interval)
	}
	wg.Wait()
	return load{calls: calls, ok: int(ok.Load()), wire: int(host.wire.Load()), hedges: int(hedges.Load()), took: time.Since(start)}
}

func (l load) String() string {
	return fmt.Sprintf("%d calls over %v: %.2f%% ok, %.3f wire calls a call, %d hedges",
		l.calls, l.took, 100*float64(l.ok)/float64(l.calls), float64(l.wire)/float64(l.calls), l.hedges)
}

// TestTheDefaultBudgetRetriesThroughATransientFault: a host that resets a
// random 20% of attempts, at 1000 calls a second for 4 seconds, with three
// attempts and the default budget. A retry that succeeds earns its token
// back, so the budget, which a fault this size would empty at any ratio
// below the 0.24 retries a call it needs (0.2 + 0.2²), lets every call that
// needs one retry: at least 99% of calls succeed (all but about 0.2³ of
// them), for no more than the retries they need, with hedges on or off.
func TestTheDefaultBudgetRetriesThroughATransientFault(t *testing.T) {
	for _, hedge := range []*policy.Hedge{nil, {}} {
		t.Run(fmt.Sprintf("hedge=%v", hedge != nil), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &flakyHost{seed: 1, fail: 0.2}
				if hedge != nil {
					// Hedges need a tail to cut: 5 to 15 ms, 5% of
					// attempts 40 ms.
					host.latency = httptestutil.Mix(
						httptestutil.Weighted{Weight: 0.95, Latency: httptestutil.Uniform(5*time.Millisecond, 15*time.Millisecond)},
						httptestutil.Weighted{Weight: 0.05, Latency: httptestutil.Constant(40 * time.Millisecond)},
					)
				}
				set := policy.Set{Attempts: 3, Retry: &policy.Retry{}, Hedge: hedge}
				l := drive(t, host, set, 4000, time.Millisecond)
				t.Log(l)
				if l.ok < l.calls*99/100 {
					t.Errorf("%s; want at least 99%% ok", l)
				}
				if float64(l.wire) > 1.35*float64(l.calls) {
					t.Errorf("%s; want at most 1.35 wire calls a call", l)
				}
				if hedge != nil && l.hedges == 0 {
					t.Errorf("%s; the hedged run sent no hedge", l)
				}
			})
		})
	}
}

// TestTheDefaultBudgetBoundsAnOutage: a host that fails every attempt, at
// 1000 calls a second for 4 seconds, with three attempts. Nothing is
// refunded, so the retries and hedges sent are at most what the budget
// ever held: Max, which it starts with, Ratio a call, and MinPerSecond
// over the run (0.213 more calls a call at this rate, within the quarter
// the defaults promise). With hedging on, its health gate sends no hedge
// to a host failing every attempt; the legs that fail or lose are
// TestAHedgeThatWinsIsRefunded's.
func TestTheDefaultBudgetBoundsAnOutage(t *testing.T) {
	for _, hedge := range []*policy.Hedge{nil, {}} {
		t.Run(fmt.Sprintf("hedge=%v", hedge != nil), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				host := &flakyHost{seed: 1, fail: 1, latency: httptestutil.Uniform(5*time.Millisecond, 15*time.Millisecond)}
				set := policy.Set{Attempts: 3, Retry: &policy.Retry{}, Hedge: hedge}
				l := drive(t, host, set, 4000, time.Millisecond)
				t.Log(l)
				b := set.Budget.WithDefaults()
				bound := b.Max + b.Ratio*float64(l.calls) + b.MinPerSecond*l.took.Seconds()
				if extra := float64(l.wire - l.calls); extra > bound {
					t.Errorf("%s: %v retries and hedges, want at most Max + Ratio×calls + MinPerSecond×%v = %.0f",
						l, extra, l.took, bound)
				}
				if l.ok != 0 {
					t.Errorf("%s; every attempt was to fail", l)
				}
			})
		})
	}
}

// refundBudget is a budget of three tokens that all but never refills, so
// that the balance says how many withdrawals stayed spent.
var refundBudget = policy.Budget{Max: 3, MinPerSecond: -1, Ratio: 1e-9}

// spent returns the tokens of refundBudget that key's calls left spent,
// rounded past what their deposits (1e-9 a call) added back.
func spent(tr *Transport, key string) float64 {
	return math.Round(refundBudget.Max - tr.Measured(key).BudgetBalance)
}

// TestARetryThatSucceedsIsRefunded: a retry whose answer is the call's
// success gives its token back; one that fails, or whose answer the
// caller gets as a failure or as a success that still asked for a retry,
// keeps it spent.
func TestARetryThatSucceedsIsRefunded(t *testing.T) {
	retry409 := &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
		If: func(resp *http.Response, err error) bool {
			return err != nil || resp.StatusCode >= 500 || resp.StatusCode == 409
		}}
	for _, tc := range []struct {
		name     string
		codes    []int
		attempts int
		retry    *policy.Retry
		spent    float64
	}{
		{"retry succeeds", []int{503, 200}, 3, nil, 0},
		{"second retry succeeds", []int{503, 503, 200}, 3, nil, 1},
		{"retries run out", []int{503}, 3, nil, 2},
		{"a success that asks for a retry", []int{409}, 2, retry409, 1},
		{"it stops asking", []int{409, 200}, 2, retry409, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &script{codes: tc.codes}
				set := retrySet()
				if tc.retry != nil {
					set.Retry = tc.retry
				}
				set.Attempts, set.Budget = tc.attempts, refundBudget
				tr := mustNew(t, Config{Base: base, Policies: set})
				resp, err := get(t, t.Context(), tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if got := spent(tr, "a.test"); got != tc.spent {
					t.Fatalf("after %d wire calls, %v tokens stayed spent, want %v", base.n(), got, tc.spent)
				}
			})
		})
	}
}

// TestAHedgeThatWinsIsRefunded: a hedge that wins gives its token back;
// one that loses keeps it spent. In a hedged retry round won by its hedge,
// the hedge's token is given back and the retry's stays spent: it paid for
// the round's first leg, which lost. Each call refunds at most the one
// token of the wire call the caller's answer came from.
func TestAHedgeThatWinsIsRefunded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		legs  [][2]int // latency in ms and status of each wire call, in order
		spent float64
	}{
		{"the hedge wins", [][2]int{{1000, 200}, {10, 200}}, 0},
		{"the hedge loses", [][2]int{{50, 200}, {1000, 200}}, 1},
		{"the hedge fails", [][2]int{{50, 200}, {1, 503}}, 1},
		{"a retry's hedge wins", [][2]int{{1, 503}, {1000, 200}, {10, 200}}, 1},
		{"a retry wins over its hedge", [][2]int{{1, 503}, {50, 200}, {1000, 200}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const warmup = 30
				base := &slowRT{latency: func(i int64, _ *http.Request) (time.Duration, int) {
					if j := int(i) - warmup; j >= 0 && j < len(tc.legs) {
						return time.Duration(tc.legs[j][0]) * time.Millisecond, tc.legs[j][1]
					}
					return 10 * time.Millisecond, 200
				}}
				var ev hedgeEvents
				set := retrySet()
				set.Hedge, set.Budget = &policy.Hedge{MaxConcurrent: 2}, refundBudget
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
				warm(t, tr, warmup)
				if got := spent(tr, "up.test"); got != 0 {
					t.Fatalf("the warm-up spent %v tokens", got)
				}
				if _, err := do(t, t.Context(), tr); err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // a losing leg's grace, and its drain
				if n := int(base.calls.Load()) - warmup; n != len(tc.legs) {
					t.Fatalf("%d wire calls, want %d", n, len(tc.legs))
				}
				if got := spent(tr, "up.test"); got != tc.spent {
					started, won := ev.counts()
					t.Fatalf("%v tokens stayed spent, want %v (%d hedges, %d won)", got, tc.spent, started, won)
				}
			})
		})
	}
}

// TestNoRefundForATokenNotWithdrawn: a call answered by its first attempt,
// and a call sent once because its request is itself a repeat, withdraw
// nothing, so they give nothing back; with the budget off a retry that
// succeeds has nothing to give back either.
func TestNoRefundForATokenNotWithdrawn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 503, 200}}
		set := retrySet()
		set.Attempts, set.Budget = 2, refundBudget
		tr := mustNew(t, Config{Base: base, Policies: set})
		for _, ctx := range []context.Context{
			t.Context(),                  // 503, and a retry that fails: one token spent
			t.Context(),                  // 200 at once
			attempt.With(t.Context(), 2), // a repeat, sent once: 200
		} {
			resp, err := get(t, ctx, tr, "http://a.test/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if got := spent(tr, "a.test"); base.n() != 4 || got != 1 {
			t.Fatalf("%d wire calls, %v tokens spent; want 4 and the failed retry's 1", base.n(), got)
		}

		base = &script{codes: []int{503, 200}}
		set.Budget = policy.Budget{Ratio: -1}
		tr = mustNew(t, Config{Base: base, Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if m := tr.Measured("a.test"); m.HasBudget || base.n() != 2 || resp.StatusCode != 200 {
			t.Fatalf("%d wire calls, status %d, Measured %+v; want the retry's 200 and no budget", base.n(), resp.StatusCode, m)
		}
	})
}

// TestBudgetRefusedHedgesSpendNoRateLimit: a hedge the budget refuses is
// not sent, and spends none of the rate limit's tokens, however many times
// its round asks again. The budget holds one hedge, which the first slow
// call's losing hedge spends; the second slow call's hedges are all
// refused; the rate limit (5/s, burst 40, full again after the warm-up)
// has spent a token on each wire call after it (two legs, one, one) and
// no more.
func TestBudgetRefusedHedgesSpendNoRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{latency: func(i int) time.Duration {
			switch i {
			case 30:
				return 20 * time.Millisecond // the first slow call's first leg, which wins
			case 31, 32:
				return 300 * time.Millisecond // its hedge, which loses; the second slow call
			}
			return 10 * time.Millisecond
		}}
		ev := &hedgeEvents{}
		set := hedgeSet()
		set.Budget = policy.Budget{Ratio: 0.0001, MinPerSecond: -1, Max: 2} // one hedge
		set.RateLimit = &policy.RateLimit{PerSecond: 5, Burst: 40}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
		warm(t, tr, 30)
		time.Sleep(10 * time.Second) // the bucket refills; the latency window keeps its samples
		full := time.Now()
		for i := range 3 {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://up.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("call %d after the warm-up: %v (hedges suppressed for the budget %d)", i+1, err, ev.reason(policy.HedgeBudget))
			}
			resp.Body.Close()
			synctest.Wait()
		}
		if started, _ := ev.counts(); started != 1 || ev.reason(policy.HedgeBudget) == 0 {
			t.Fatalf("hedges started %d, suppressed for the budget %d; want 1 and some", started, ev.reason(policy.HedgeBudget))
		}
		accrued := time.Since(full).Seconds()
		if left, want := tokensLeft(tr, "up.test"), int(40-4+5*accrued); base.calls != 34 || left != want {
			t.Fatalf("%d rate-limit tokens left after %d wire calls, want 34 calls and %d left", left, base.calls, want)
		}
	})
}
