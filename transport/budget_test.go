package transport

import (
	"context"
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/policy"
)

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
