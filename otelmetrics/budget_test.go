package otelmetrics_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// budgetRun is what one run of TestRetryBudgetEffect saw.
type budgetRun struct {
	calls, failed int
	wire          int64   // requests the upstream received
	skipped       float64 // resilix.retries.skipped{reason=budget}
	// firstFailed counts the calls whose first attempt failed, unretried
	// those of them the budget kept from retrying at all.
	firstFailed, unretried int64
}

// runBudget makes calls GETs, from callers goroutines in closed loops, to
// an in-memory upstream that answers 503 to 30% of requests, through a
// transport with Retry and Attempts 3 (the defaults) and the given budget.
// It runs inside a synctest bubble, so time is virtual.
func runBudget(t *testing.T, budget policy.Budget, calls, callers int) budgetRun {
	reader, obs := newObserver(t)
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Uniform(5*time.Millisecond, 15*time.Millisecond),
		Faults:  []httptestutil.Fault{{Probability: 0.3, Status: http.StatusServiceUnavailable}},
		Seed:    30,
	})
	var firstFailed, unretried atomic.Int64
	count := &policy.Observer{
		AttemptDone: func(a policy.AttemptInfo) {
			if a.Attempt == 1 && a.Outcome == policy.Failure {
				firstFailed.Add(1)
			}
		},
		RetrySkipped: func(k policy.RetrySkip) {
			if k.Attempt == 1 && k.Reason == policy.SkipBudget {
				unretried.Add(1)
			}
		},
	}
	tr, err := transport.New(transport.Config{
		Base:     up.RoundTripper(),
		Policies: policy.Set{Retry: &policy.Retry{}, Budget: budget},
		Observer: policy.JoinObservers(obs, count),
	})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for i := range callers {
		n := calls / callers
		if i < calls%callers {
			n++
		}
		wg.Go(func() {
			for range n {
				resp, err := client.Get("http://flaky.test/")
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	synctest.Wait() // superseded responses finish draining

	var skipped float64
	for k, v := range collect(t, reader).values {
		if strings.HasPrefix(k, "resilix.retries.skipped{") && strings.HasSuffix(k, "reason=budget}") {
			skipped += v
		}
	}
	return budgetRun{
		calls: calls, failed: failed, wire: up.Stats().Requests, skipped: skipped,
		firstFailed: firstFailed.Load(), unretried: unretried.Load(),
	}
}

// TestRetryBudgetEffect measures what the retry budget does to the calls
// that fail, the figures docs/retries.md and the package doc quote: against an
// upstream that fails 30% of requests, with Attempts 3, the default budget
// (a fifth of the calls, plus 10 tokens a second; a retry that succeeds earns its
// token back) against none. Run it with -v to print them:
//
//	go test -run TestRetryBudgetEffect -v ./otelmetrics
func TestRetryBudgetEffect(t *testing.T) {
	const calls, callers = 20000, 20
	for _, c := range []struct {
		name   string
		budget policy.Budget
		// The failure rate must land in [lo, hi]: around 0.3³ = 2.7%
		// with the budget as without. The calls retry 0.3 + 0.3² = 0.39
		// times each, and the 70% of retries that succeed refund theirs,
		// which leaves 0.12 tokens a call spent of the 0.2 deposited; only
		// the first calls' bursts, before the deposits, meet an empty
		// bucket.
		lo, hi float64
	}{
		{"default budget", policy.Budget{}, 0.015, 0.04},
		{"budget off", policy.Budget{Ratio: -1}, 0.015, 0.04},
	} {
		var r budgetRun
		synctest.Test(t, func(t *testing.T) { r = runBudget(t, c.budget, calls, callers) })
		rate := float64(r.failed) / float64(r.calls)
		t.Logf("%-14s  %d calls, %5.1f%% failed, %.2f wire calls per call; %.0f retries skipped for the budget; %d of the %d calls whose first attempt failed (%.0f%%) never retried",
			c.name, r.calls, 100*rate, float64(r.wire)/float64(r.calls), r.skipped,
			r.unretried, r.firstFailed, 100*float64(r.unretried)/float64(r.firstFailed))
		if rate < c.lo || rate > c.hi {
			t.Errorf("%s: %.1f%% of calls failed, want %.1f%% to %.1f%%", c.name, 100*rate, 100*c.lo, 100*c.hi)
		}
		// Off, the budget skips nothing; on, it may skip a few in the
		// first bursts, never more than a hundredth of the calls.
		if off := c.budget.Ratio < 0; off && r.skipped != 0 || r.skipped > calls/100 {
			t.Errorf("%s: %v retries skipped for the budget", c.name, r.skipped)
		}
	}
}
