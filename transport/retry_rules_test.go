package transport

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestDelayReplacesTheBackoff: with Retry.Delay set, the waits between
// attempts are exactly what it returns, asked with the retry's number
// from 1, and no jitter is drawn.
func TestDelayReplacesTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 503, 503, 200}}
		var mu sync.Mutex
		var asked []int
		var sent []time.Duration
		start := time.Now()
		probe := fakeRT(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, time.Since(start))
			return base.RoundTrip(r)
		})
		set := policy.Set{Attempts: 4, Retry: &policy.Retry{Delay: func(retry int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, retry)
			return time.Duration(retry) * 7 * time.Second
		}}}
		tr := mustNew(t, Config{Base: probe, Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		resp.Body.Close()
		if want := []int{1, 2, 3}; !slices.Equal(asked, want) {
			t.Errorf("Delay asked for retries %v, want %v", asked, want)
		}
		want := []time.Duration{0, 7 * time.Second, 21 * time.Second, 42 * time.Second}
		if !slices.Equal(sent, want) {
			t.Errorf("attempts sent at %v, want %v", sent, want)
		}
	})
}

// TestDelayIsBoundedByRetryAfterAndTheDeadline: Retry-After, MaxRetryAfter
// and the deadline apply on top of Delay as they do on top of the backoff.
func TestDelayIsBoundedByRetryAfterAndTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		delay      time.Duration
		retryAfter string
		deadline   time.Duration // 0: none
		wait       time.Duration // before the retry; -1: no retry
		skip       policy.SkipReason
	}{
		{"Retry-After longer", time.Second, "3", 0, 3 * time.Second, 0},
		{"Delay longer", 5 * time.Second, "3", 0, 5 * time.Second, 0},
		{"Retry-After beyond MaxRetryAfter", time.Second, "60", 0, -1, policy.SkipRetryAfter},
		{"Delay past the deadline", 10 * time.Second, "", 5 * time.Second, -1, policy.SkipDeadline},
		{"negative Delay", -time.Second, "", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var hdr []string
				if tc.retryAfter != "" {
					hdr = []string{"Retry-After", tc.retryAfter}
				}
				base := &script{codes: []int{503, 200}, hdr: hdr}
				var skips []policy.RetrySkip
				set := policy.Set{Retry: &policy.Retry{Delay: func(int) time.Duration { return tc.delay }}}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
					RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
				}})
				ctx := t.Context()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				start := time.Now()
				resp, err := get(t, ctx, tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				took := time.Since(start)
				if tc.wait < 0 {
					if base.n() != 1 || took != 0 || len(skips) != 1 || skips[0].Reason != tc.skip {
						t.Fatalf("%d calls after %v, skips %+v; want one call, at once, skipped for %v", base.n(), took, skips, tc.skip)
					}
					return
				}
				if base.n() != 2 || took != tc.wait || resp.StatusCode != 200 {
					t.Fatalf("%d calls, %d after %v; want the retry after %v", base.n(), resp.StatusCode, took, tc.wait)
				}
			})
		})
	}
}

// retryConflicts is a Retry.If that retries a 409 Conflict besides what
// DefaultClassify calls a failure.
func retryConflicts(resp *http.Response, err error) bool {
	return resp != nil && resp.StatusCode == http.StatusConflict ||
		policy.DefaultClassify(resp, err) == policy.Failure
}

// breakerRate reads the breaker's window of key on tr.
func breakerRate(t *testing.T, tr *Transport, key string) (calls, failures uint64) {
	t.Helper()
	s := tr.scopes.lookup(key)
	if s == nil || s.breaker == nil {
		t.Fatalf("no breaker for %q", key)
	}
	r := s.breaker.Rate(time.Now())
	return r.Calls, r.Failures
}

// TestIfRetriesWithoutTeachingTheBreaker: a 409 that Retry.If retries is
// still a Success for the dependency's health, since Classify alone feeds
// the breaker: after two of them and a 200, the breaker has seen three
// calls and no failure.
func TestIfRetriesWithoutTeachingTheBreaker(t *testing.T) {
	base := &script{codes: []int{409, 409, 200}}
	set := retrySet()
	set.Retry.If = retryConflicts
	set.Breaker = &policy.Breaker{}
	var calls []policy.CallInfo
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		CallDone: func(c policy.CallInfo) { calls = append(calls, c) },
	}})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 200 || base.n() != 3 {
		t.Fatalf("got %v, %v after %d calls; want 200 after 3", resp, err, base.n())
	}
	resp.Body.Close()
	if n, failures := breakerRate(t, tr, "a.test"); n != 3 || failures != 0 {
		t.Fatalf("breaker saw %d calls, %d failures; want 3 and 0", n, failures)
	}

	// Attempts run out on a 409: the caller gets it, a success.
	base = &script{codes: []int{409}}
	tr = mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		CallDone: func(c policy.CallInfo) { calls = append(calls, c) },
	}})
	resp, err = get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 409 || base.n() != 3 {
		t.Fatalf("got %v, %v after %d calls; want the last 409 after 3", resp, err, base.n())
	}
	resp.Body.Close()
	if n, failures := breakerRate(t, tr, "a.test"); n != 3 || failures != 0 {
		t.Fatalf("breaker saw %d calls, %d failures; want 3 and 0", n, failures)
	}
	if last := calls[len(calls)-1]; last.Outcome != policy.Success || last.WireAttempts != 3 {
		t.Fatalf("CallDone %+v, want a success after 3 wire attempts", last)
	}
}

// TestIfDeclinesAFailureTheBreakerStillCounts: If may also decline what
// Classify calls a failure; the breaker still learns it.
func TestIfDeclinesAFailureTheBreakerStillCounts(t *testing.T) {
	base := &script{codes: []int{503, 200}}
	set := retrySet()
	set.Retry.If = func(resp *http.Response, err error) bool { return err != nil }
	set.Breaker = &policy.Breaker{}
	tr := mustNew(t, Config{Base: base, Policies: set})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 503 || base.n() != 1 {
		t.Fatalf("got %v, %v after %d calls; want the 503, not retried", resp, err, base.n())
	}
	resp.Body.Close()
	if n, failures := breakerRate(t, tr, "a.test"); n != 1 || failures != 1 {
		t.Fatalf("breaker saw %d calls, %d failures; want 1 and 1", n, failures)
	}
}

// TestIfCannotRepeatAPlainPost: the idempotency rules apply on top of If.
func TestIfCannotRepeatAPlainPost(t *testing.T) {
	base := &script{codes: []int{409, 200}}
	set := retrySet()
	set.Retry.If = func(*http.Response, error) bool { return true }
	var skips []policy.RetrySkip
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
	}})
	req, _ := http.NewRequest(http.MethodPost, "http://a.test/", strings.NewReader("pay"))
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 409 {
		t.Fatalf("got %v, %v", resp, err)
	}
	resp.Body.Close()
	if base.n() != 1 || len(skips) != 1 || skips[0].Reason != policy.SkipNotReplayable {
		t.Fatalf("calls=%d skips=%+v; want one call and a not_replayable skip", base.n(), skips)
	}
}

// TestIfIsNotAskedAboutTheCallersCancellation: an attempt the caller gave
// up on is never retried, whatever If would say, and If is not asked.
func TestIfIsNotAskedAboutTheCallersCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent, asked atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		set := retrySet()
		set.Retry.If = func(*http.Response, error) bool { asked.Add(1); return true }
		tr := mustNew(t, Config{Base: base, Policies: set})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, cancel)
		_, err := get(t, ctx, tr, "http://a.test/")
		if err != context.Canceled || sent.Load() != 1 || asked.Load() != 0 {
			t.Fatalf("err = %v after %d calls, If asked %d times; want context.Canceled, 1, 0", err, sent.Load(), asked.Load())
		}
	})
}

// TestIfDecidesWhichLegWinsAHedgedRound: in a hedged round, an answer that
// If would retry does not win the race, even when Classify calls it a
// success; the leg still on the wire may answer better. An answer that
// If would not retry but Classify calls a failure does not win either.
func TestIfDecidesWhichLegWinsAHedgedRound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hedge int // the fast hedge leg's status
		If    func(*http.Response, error) bool
	}{
		{"a conflict If retries", 409, retryConflicts},
		{"a failure If declines", 503, func(*http.Response, error) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
					switch {
					case i < 30:
						return 10 * time.Millisecond, 200
					case i == 30:
						return 50 * time.Millisecond, 200 // slow first leg, succeeds
					}
					return time.Millisecond, tc.hedge // the hedge answers fast
				}}
				var ev hedgeEvents
				set := policy.Set{
					Retry: &policy.Retry{If: tc.If},
					Hedge: &policy.Hedge{MaxConcurrent: 2},
				}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
				warm(t, tr, 30)
				code, err := do(t, t.Context(), tr)
				if err != nil || code != 200 || base.calls.Load() != 32 {
					t.Fatalf("got %d, %v after %d wire calls; the first leg's 200 should win over the hedge's %d",
						code, err, base.calls.Load()-30, tc.hedge)
				}
				if s, w := ev.counts(); s != 1 || w != 0 {
					t.Fatalf("started %d won %d", s, w)
				}
				synctest.Wait()
			})
		})
	}
}

// TestRetryAfterCountsOnlyOn429And503: Retry-After stretches the wait
// before a retry, or ends the call when it asks too much, only on the two
// statuses that carry it as pushback, 429 and 503, as the throttler reads
// it. On any other status it is not read: the retry waits its Delay, and a
// value that cannot be parsed is not reported.
func TestRetryAfterCountsOnlyOn429And503(t *testing.T) {
	for _, tc := range []struct {
		code       int
		retryAfter string
		wait       time.Duration // before the retry; -1: no retry
		malformed  int
	}{
		{429, "3", 3 * time.Second, 0},
		{503, "3", 3 * time.Second, 0},
		{503, "60", -1, 0},
		{503, "soon", time.Second, 1},
		{502, "3", time.Second, 0},
		{502, "60", time.Second, 0},
		{502, "soon", time.Second, 0},
		{500, "3", time.Second, 0},
		{504, "3", time.Second, 0},
		{408, "3", time.Second, 0},
	} {
		t.Run(strconv.Itoa(tc.code)+" "+tc.retryAfter, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &script{codes: []int{tc.code, 200}, hdr: []string{"Retry-After", tc.retryAfter}}
				var malformed int
				set := policy.Set{Retry: &policy.Retry{Delay: func(int) time.Duration { return time.Second }}}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
					MalformedHeader: func(policy.MalformedHeader) { malformed++ },
				}})
				start := time.Now()
				resp, err := get(t, t.Context(), tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				took := time.Since(start)
				switch {
				case tc.wait < 0:
					if base.n() != 1 || took != 0 || resp.StatusCode != tc.code {
						t.Errorf("%d calls, %d after %v; want the %d at once", base.n(), resp.StatusCode, took, tc.code)
					}
				case base.n() != 2 || took != tc.wait || resp.StatusCode != 200:
					t.Errorf("%d calls, %d after %v; want the retry after %v", base.n(), resp.StatusCode, took, tc.wait)
				}
				if malformed != tc.malformed {
					t.Errorf("%d malformed headers reported, want %d", malformed, tc.malformed)
				}
			})
		})
	}
}
