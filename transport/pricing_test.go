package transport_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

// The pricing scenario: an API that allows 40 calls a second, called by a
// service whose user-facing calls (Critical, untagged) come at 25 a second
// and need an answer within a second, while a background prefetch (Bulk)
// calls it as fast as it is let. The API is a token bucket of 40/s and a
// burst of 8 that answers the excess with 429 and Retry-After: 1; the
// client's RateLimit is 40/s with a burst of 5 and a MaxWait of 1s, in the
// README's quick-start chain with the throttler added (pricingPolicies).
// The targets, over the scenario's duration d:
//
//   - every Critical call gets its 200;
//   - nobody gets a 429: none answered by the API, none received by the
//     client on any wire attempt;
//   - Bulk gets at least 80% of the 15/s the Critical calls leave;
//   - the API sees at most 40/s × d + 5 calls, the client's own bucket:
//     it starts full with 5 tokens, and every wire attempt (retries and
//     hedges too) spends one.
//
// TestPricing runs it in a testing/synctest bubble over an in-memory API,
// TestPricingLoopback (opt-in, RESILIX_PRICING) over loopback sockets. Each
// also runs the same chain without the RateLimit and prints its figures
// beside: there the throttler's pushback alone paces Bulk, after the API's
// 429s, and Critical calls draw some of them.
const (
	pricingRate          = 40 // the API's limit, and the client's RateLimit.PerSecond
	pricingUpstreamBurst = 8
	pricingBurst         = 5
	pricingCritical      = 25 // Critical calls a second, paced
	pricingBulkCallers   = 16
	pricingDeadline      = time.Second // of every call, Critical and Bulk
	pricingLatency       = time.Millisecond
	pricingBulkShare     = 0.8 // of the rate Critical leaves
)

// pricingAPI returns the rate-limited API: answers 200 "ok" after
// pricingLatency, at most pricingRate a second with a burst of
// pricingUpstreamBurst, 429 and Retry-After: 1 beyond.
func pricingAPI() *httptestutil.RateLimit {
	up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(pricingLatency)})
	return httptestutil.NewRateLimit(up, httptestutil.RateLimitOptions{
		PerSecond: pricingRate,
		Burst:     pricingUpstreamBurst,
	})
}

// pricingPolicies is the README's quick-start chain with the throttler and
// the API's rate limit added.
func pricingPolicies() policy.Set {
	s := pricingUnlimited()
	s.RateLimit = &policy.RateLimit{PerSecond: pricingRate, Burst: pricingBurst, MaxWait: time.Second}
	return s
}

// pricingUnlimited is pricingPolicies without the RateLimit: the throttler's
// pushback alone stands between the flood and the API's 429s.
func pricingUnlimited() policy.Set {
	return policy.Set{
		Attempts:  3,
		Retry:     &policy.Retry{},
		Hedge:     &policy.Hedge{Quantile: 0.95},
		Throttler: &policy.Throttler{},
		Breaker:   &policy.Breaker{},
		Limiter:   &policy.Limiter{},
		Timeout:   &policy.Timeout{PerAttempt: 2 * time.Second, Idle: 10 * time.Second},
	}
}

// pricingFigures is what one run of the scenario measured.
type pricingFigures struct {
	seconds float64 // from the first call to the count at the API

	critical, criticalOK int64
	criticalFailures     []string // the first few, with when and why

	bulkOK, bulkRefused, bulkOther int64 // Bulk calls started within d

	upstream    int64 // calls the API saw within d, refused ones included
	upstream429 int64 // refusals the API answered, over the whole run
	client429   int64 // wire attempts the client got a 429 on, over the whole run
	hedges      int64
	retries     int64
	pushbacks   int64
	refusedBy   [8]int64 // gate refusals the observer heard, by policy.Gate
}

// runPricing runs the scenario for d through a transport of set over base
// to url, the API being api, and returns its figures. settle is called at
// the end of d, before the API's calls are counted: synctest.Wait in a
// bubble, so that what arrives at that instant has arrived.
func runPricing(t *testing.T, set policy.Set, base http.RoundTripper, url string, api *httptestutil.RateLimit, d time.Duration, settle func()) *pricingFigures {
	t.Helper()
	f := &pricingFigures{}
	var (
		mu        sync.Mutex
		client429 atomic.Int64
		hedges    atomic.Int64
		retries   atomic.Int64
		pushes    atomic.Int64
		refused   [len(f.refusedBy)]atomic.Int64
	)
	tr, err := transport.New(transport.Config{
		Base:     base,
		Policies: set,
		Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				if a.StatusCode == http.StatusTooManyRequests {
					client429.Add(1)
				}
				if a.Kind == policy.AttemptRetry {
					retries.Add(1)
				}
			},
			HedgeStarted: func(policy.HedgeInfo) { hedges.Add(1) },
			Pushback:     func(policy.Pushback) { pushes.Add(1) },
			Refused: func(r policy.Refusal) {
				if int(r.Gate) < len(refused) {
					refused[r.Gate].Add(1)
				}
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	start := time.Now()
	end := start.Add(d)
	// call makes one call with its deadline and reads the answer.
	call := func(ctx context.Context) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, pricingDeadline)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0, err
		}
		return resp.StatusCode, nil
	}

	var wg sync.WaitGroup
	for range pricingBulkCallers {
		wg.Go(func() {
			ctx := shedding.WithPriority(context.Background(), shedding.Bulk)
			for time.Now().Before(end) {
				code, err := call(ctx)
				var rej *policy.RejectedError
				switch {
				case err == nil && code == http.StatusOK:
					atomic.AddInt64(&f.bulkOK, 1)
				case errors.As(err, &rej):
					atomic.AddInt64(&f.bulkRefused, 1)
					time.Sleep(max(rej.RetryAfter, time.Millisecond)) // as a prefetch that honours the hint
				default: // a 429 that retries did not get past, a deadline: counted, and the loop goes on
					atomic.AddInt64(&f.bulkOther, 1)
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	tick := time.NewTicker(time.Second / pricingCritical)
	for now := start; now.Before(end); now = <-tick.C {
		f.critical++
		at := now.Sub(start)
		wg.Go(func() {
			code, err := call(context.Background())
			if err == nil && code == http.StatusOK {
				atomic.AddInt64(&f.criticalOK, 1)
				return
			}
			why := fmt.Sprint(err)
			if err == nil {
				why = fmt.Sprintf("status %d", code)
			}
			mu.Lock()
			if len(f.criticalFailures) < 5 {
				f.criticalFailures = append(f.criticalFailures, fmt.Sprintf("call at %v: %s", at.Round(time.Millisecond), why))
			}
			mu.Unlock()
		})
	}
	tick.Stop()
	settle()
	st := api.Stats()
	f.seconds = time.Since(start).Seconds()
	f.upstream = st.Admitted + st.Refused
	wg.Wait()
	f.upstream429 = api.Stats().Refused
	f.client429 = client429.Load()
	f.hedges, f.retries, f.pushbacks = hedges.Load(), retries.Load(), pushes.Load()
	for g := range refused {
		f.refusedBy[g] = refused[g].Load()
	}
	return f
}

// report logs the figures as a table beside those of without, the same
// scenario with no RateLimit, and fails the test on each target f missed.
func (f *pricingFigures) report(t *testing.T, title string, without *pricingFigures) {
	t.Helper()
	tb := &figureTable{cols: []string{"figure", "RateLimit", "none", "target"}}
	row := func(name string, cell func(*pricingFigures) string, target string) {
		tb.row(name, cell(f), cell(without), target)
	}
	row("Critical ok / total", func(f *pricingFigures) string { return fmt.Sprintf("%d/%d", f.criticalOK, f.critical) }, "all")
	row("Bulk ok /s", func(f *pricingFigures) string { return fmt.Sprintf("%.2f", f.bulkRate()) },
		fmt.Sprintf(">= %.1f (%.0f%% of %d/s)", pricingBulkFair, 100*pricingBulkShare, pricingRate-pricingCritical))
	row("429s at the API", func(f *pricingFigures) string { return fmt.Sprint(f.upstream429) }, "0")
	row("429s at the client", func(f *pricingFigures) string { return fmt.Sprint(f.client429) }, "0")
	row("API calls in d", func(f *pricingFigures) string { return fmt.Sprint(f.upstream) },
		fmt.Sprintf("<= %d (%d/s × %.2fs + %d)", f.bound(), pricingRate, f.seconds, pricingBurst))
	row("Bulk refused / other", func(f *pricingFigures) string { return fmt.Sprintf("%d/%d", f.bulkRefused, f.bulkOther) }, "")
	for _, g := range []policy.Gate{policy.GateRateLimit, policy.GateThrottler, policy.GateLimiter} {
		row("refused: "+g.String(), func(f *pricingFigures) string { return fmt.Sprint(f.refusedBy[g]) }, "")
	}
	row("hedges / retries", func(f *pricingFigures) string { return fmt.Sprintf("%d/%d", f.hedges, f.retries) }, "")
	row("pushbacks armed", func(f *pricingFigures) string { return fmt.Sprint(f.pushbacks) }, "")

	tb.check(f.criticalOK == f.critical, "%d of %d Critical calls ok, target all; first failures: %q", f.criticalOK, f.critical, f.criticalFailures)
	tb.check(f.bulkRate() >= pricingBulkFair, "Bulk got %.2f calls/s, target >= %.1f", f.bulkRate(), pricingBulkFair)
	tb.check(f.upstream429 == 0, "the API answered %d calls with 429, target 0", f.upstream429)
	tb.check(f.client429 == 0, "the client got a 429 on %d wire attempts, target 0", f.client429)
	tb.check(f.upstream <= f.bound(), "the API saw %d calls in %.2fs, target <= %d", f.upstream, f.seconds, f.bound())
	tb.log(t, title)
}

// pricingBulkFair is the Bulk rate the targets ask for: pricingBulkShare
// of what the Critical calls leave of the rate.
const pricingBulkFair = pricingBulkShare * (pricingRate - pricingCritical)

// bulkRate is the Bulk calls ok a second.
func (f *pricingFigures) bulkRate() float64 { return float64(f.bulkOK) / f.seconds }

// bound is the most calls the API may see in f.seconds: the client's
// bucket.
func (f *pricingFigures) bound() int64 {
	return int64(pricingRate*f.seconds) + pricingBurst
}

// TestPricing: the pricing scenario in a bubble, over an in-memory API,
// for 6s of virtual time, beside the same without the RateLimit, which
// must draw 429s from the API, or the scenario would not test the
// RateLimit at all.
func TestPricing(t *testing.T) {
	f, without := pricingBoth(t, 6*time.Second, func(t *testing.T, set policy.Set, d time.Duration) *pricingFigures {
		var f *pricingFigures
		synctest.Test(t, func(t *testing.T) {
			api := pricingAPI()
			f = runPricing(t, set, httptestutil.InMemory(api), "http://pricing.test/", api, d, synctest.Wait)
		})
		return f
	})
	f.report(t, "pricing in synctest, 6s of virtual time", without)
	if without.upstream429 == 0 {
		t.Errorf("without the RateLimit the API answered no 429: the flood does not reach its limit")
	}
}

// pricingBoth runs the scenario for d with run, with the RateLimit and
// without it, and returns the figures of each.
func pricingBoth(t *testing.T, d time.Duration, run func(*testing.T, policy.Set, time.Duration) *pricingFigures) (with, without *pricingFigures) {
	return run(t, pricingPolicies(), d), run(t, pricingUnlimited(), d)
}
