package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestARefusedHedgeSpendsNothing: a hedge that passes the hedging gates
// and is then refused by a later step (waiting for the body, the budget,
// admission, the rate limit, the body itself) leaves WinRate's credit,
// the budget's tokens and its hedges' allowance, the rate limit and the
// admission gates' permits as they were. With the allowance at 0.5 a
// hedge goes every second opportunity; each opportunity refused later
// must leave the credit where it was, so that, of a run of such
// opportunities, at most the first is refused for its value, and the next
// ones reach the step that refuses them. A credit spent by a refused hedge
// (or by its round asking again) turns every second opportunity into a
// refusal for value. The budget's balance is unchanged by the run, and
// the rate limit has spent exactly a token per wire call.
func TestARefusedHedgeSpendsNothing(t *testing.T) {
	const (
		runs  = 6
		burst = 500
	)
	for _, tc := range []struct {
		name   string
		reason policy.SuppressReason
		set    func(*policy.Set)
		// prepare runs on the scope once the window is warm.
		prepare func(s *scope, now time.Time)
		// answer is the base's answer in the run, where every first leg
		// is slow enough to come due for a hedge.
		answer func(r *http.Request) (*http.Response, error)
		// call makes the run's calls.
		call func(t *testing.T, tr *Transport)
	}{
		{
			name:   "waiting for the body",
			reason: policy.HedgeBodyPending,
			answer: func(r *http.Request) (*http.Response, error) {
				// Reads the first chunk only, and answers while the
				// rest is still on its way.
				if _, err := io.ReadFull(r.Body, make([]byte, 512)); err != nil {
					return nil, err
				}
				return respondAfter(r, 30*time.Millisecond)
			},
			call: func(t *testing.T, tr *Transport) {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", trickle(randomBytes(4<<10)))
				finish(t, tr, req)
			},
		},
		{
			name:   "the budget",
			reason: policy.HedgeBudget,
			// The hedges' allowance holds 2 tokens, spent here.
			set: func(s *policy.Set) { s.Budget = policy.Budget{Ratio: 1e-4, MinPerSecond: -1, Max: 4} },
			prepare: func(s *scope, now time.Time) {
				s.budget.WithdrawHedge(now)
				s.budget.WithdrawHedge(now)
			},
		},
		{
			name:   "admission",
			reason: policy.HedgeRejected,
			set:    func(s *policy.Set) { s.Bulkhead = &policy.Bulkhead{MaxConcurrent: 2} },
			// Two calls at a time hold both slots: their hedges find none.
			call: func(t *testing.T, tr *Transport) {
				var wg sync.WaitGroup
				for range 2 {
					wg.Go(func() {
						if _, err := do(t, t.Context(), tr); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
			},
		},
		{
			// The bucket, a token short of full after the warm-up, has
			// none for a hedge; the admission gates before it have
			// permits.
			name:   "the rate limit",
			reason: policy.HedgeRejected,
			set:    func(s *policy.Set) { s.Limiter = &policy.Limiter{} },
		},
		{
			name:   "the body",
			reason: policy.HedgeBodyError,
			call: func(t *testing.T, tr *Transport) {
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", bytes.NewReader([]byte("x")))
				req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no second body") }
				finish(t, tr, req)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int64
				var slow atomic.Bool
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					calls.Add(1)
					switch {
					case !slow.Load():
						return respondAfter(r, 10*time.Millisecond)
					case tc.answer != nil:
						return tc.answer(r)
					}
					return respondAfter(r, 300*time.Millisecond)
				})
				ev := &hedgeEvents{}
				set := policy.Set{
					Hedge: &policy.Hedge{MaxConcurrent: 2, Window: 10 * time.Second, Quantile: 0.5,
						WinRate: &policy.WinRate{Floor: 0.9, MinAllowance: 0.5, MinSamples: 1}},
					Budget:    policy.Budget{Ratio: 1e-4, MinPerSecond: -1, Max: 100},
					RateLimit: &policy.RateLimit{PerSecond: 1e-6, Burst: burst},
				}
				if tc.set != nil {
					tc.set(&set)
				}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
				warm(t, tr, 1)
				s := tr.scopes.lookup("up.test")
				// Two hedges that lost, which WinRate judges at the end
				// of the window: the allowance halves.
				s.hedge.Started(time.Now())
				s.hedge.Started(time.Now())
				time.Sleep(10 * time.Second)
				warm(t, tr, 30)
				if a := tr.Measured("up.test").HedgeAllowance; a != 0.5 {
					t.Fatalf("allowance %v after the warm-up, want 0.5", a)
				}
				if tc.prepare != nil {
					tc.prepare(s, time.Now())
				}

				balance := tr.Measured("up.test").BudgetBalance
				allowance := hedgesLeft(s, time.Now())
				slow.Store(true)
				for range runs {
					if tc.call != nil {
						tc.call(t, tr)
					} else if _, err := do(t, t.Context(), tr); err != nil {
						t.Fatal(err)
					}
					synctest.Wait()
				}
				refused, valued := ev.reason(tc.reason), ev.reason(policy.HedgeValue)
				if started, _ := ev.counts(); started != 0 || refused < runs-1 || valued > 1 {
					t.Errorf("%d hedges started, %d refused for %v, %d for their value; want none started, "+
						"and at most the first refused for its value: a refused hedge spent WinRate's credit (suppressions: %v)",
						started, refused, tc.reason, valued, ev.suppressed)
				}
				// Each call deposits 1e-4.
				if got := tr.Measured("up.test").BudgetBalance; math.Abs(got-balance) > 0.01 {
					t.Errorf("budget balance %.4f after the run, %.4f before: a refused hedge kept its token", got, balance)
				}
				// Each call adds 5e-5 to the allowance, which counts whole
				// hedges.
				if got := hedgesLeft(s, time.Now()); got != allowance {
					t.Errorf("%d hedges left in the budget's allowance after the run, %d before: a refused hedge kept its share", got, allowance)
				}
				if n := s.limiter.InFlight(); n != 0 {
					t.Errorf("%d limiter permits held after the run, want 0: a refused hedge kept its permit", n)
				}
				if n := s.bulkhead.InFlight(); n != 0 {
					t.Errorf("%d bulkhead slots held after the run, want 0: a refused hedge kept its slot", n)
				}
				if left, want := tokensLeft(tr, "up.test"), burst-int(calls.Load()); left != want {
					t.Errorf("%d rate-limit tokens left after %d wire calls, want %d", left, calls.Load(), want)
				}
			})
		})
	}
}

// finish sends req through tr and reads and closes the answer.
func finish(t *testing.T, tr *Transport, req *http.Request) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// hedgesLeft counts the whole hedges s's budget allows at now, by taking
// them and giving each back (RefundHedge returns exactly what
// WithdrawHedge took while the clock stands still, as it does in a
// synctest bubble).
func hedgesLeft(s *scope, now time.Time) int {
	n := 0
	for s.budget.WithdrawHedge(now) {
		n++
	}
	for range n {
		s.budget.RefundHedge(now)
	}
	return n
}

// tokensLeft counts, by taking them, the whole tokens key's rate limit
// holds now. Inside a synctest bubble the clock does not move meanwhile,
// so no token accrues while it counts.
func tokensLeft(tr *Transport, key string) int {
	s := tr.scopes.lookup(key)
	n := 0
	for now := time.Now(); ; n++ {
		if ok, _ := s.rate.AcquireFor(context.Background(), now, shedding.Critical); !ok {
			return n
		}
	}
}
