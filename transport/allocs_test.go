package transport

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestAllocationBudgets holds a successful call on a fake base to the
// allocations each chain is allowed, counting the base's own (the
// *http.Response): BenchmarkRoundTrip measures the same chains.
func TestAllocationBudgets(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	timeout := &policy.Timeout{PerAttempt: time.Hour}
	soon, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain, hedging := plainTransport, hedgingTransport
	for _, tc := range []struct {
		name string
		new  func(testing.TB) *Transport
		ctx  context.Context
		max  float64
	}{
		{"no policy", plain(policy.Set{}), context.Background(), 1},
		{"retry", plain(policy.Set{Retry: &policy.Retry{}}), context.Background(), 1},
		// A context and its cancel func, and one allocation for the
		// request copy and the body wrapper; the timer comes from the
		// pool (see alarm).
		{"retry+breaker+timeout", plain(policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: timeout}), context.Background(), 4},
		// The caller's deadline comes before the attempt's would: the
		// attempt needs neither a timer nor a context of its own.
		{"retry+timeout, the caller's deadline first", plain(policy.Set{Retry: &policy.Retry{}, Timeout: timeout}), soon, 1},
		// The round (with the inline leg's request copy and body
		// wrapper), the inline leg's context and its cancel func; the
		// round's one timer comes from the pool.
		{"hedge armed", hedging(policy.Set{Hedge: &policy.Hedge{}}), context.Background(), 4},
		{"every policy, nothing firing", hedging(fullSet()), context.Background(), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := tc.new(t)
			req, _ := http.NewRequestWithContext(tc.ctx, http.MethodGet, "http://a.test/", nil)
			call := func() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			call() // the key's state
			if n := testing.AllocsPerRun(200, call); n > tc.max {
				t.Errorf("%v allocations a call, want at most %v", n, tc.max)
			}
		})
	}
}

// plainTransport and hedgingTransport build, for an allocation table's
// row, a transport of set over okBase, and one whose hedging is warm and
// idle (idleHedge).
func plainTransport(set policy.Set) func(testing.TB) *Transport {
	return func(t testing.TB) *Transport { return mustNew(t, Config{Base: okBase{}, Policies: set}) }
}

func hedgingTransport(set policy.Set) func(testing.TB) *Transport {
	return func(t testing.TB) *Transport { return idleHedge(t, set) }
}
