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
	for _, tc := range []struct {
		name string
		set  policy.Set
		ctx  context.Context
		max  float64
	}{
		{"no policy", policy.Set{}, context.Background(), 1},
		{"retry", policy.Set{Retry: &policy.Retry{}}, context.Background(), 1},
		// The caller's deadline comes before the attempt's would: the
		// attempt needs neither a timer nor a context of its own.
		{"retry+timeout, the caller's deadline first", policy.Set{Retry: &policy.Retry{}, Timeout: timeout}, soon, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := mustNew(t, Config{Base: okBase{}, Policies: tc.set})
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
