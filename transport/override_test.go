package transport

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestOverrideAttemptsNarrowsNeverWidens: Override.Attempts lowers the
// set's Attempts for one call; asking for more gets the set's.
func TestOverrideAttemptsNarrowsNeverWidens(t *testing.T) {
	for _, tc := range []struct {
		o    Override
		want int // wire calls, the set allowing 3
	}{
		{Override{}, 3},
		{Override{Attempts: 2}, 2},
		{Override{Attempts: 1}, 1},
		{Override{Attempts: 3}, 3},
		{Override{Attempts: 10}, 3},
		{Override{NoRetry: true}, 1},
		{Override{NoHedge: true}, 3},
	} {
		base := &script{codes: []int{503}}
		var skips []policy.RetrySkip
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
			RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
		}})
		resp, err := get(t, WithOverride(t.Context(), tc.o), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("%+v: got %v, %v", tc.o, resp, err)
		}
		resp.Body.Close()
		if base.n() != tc.want || len(skips) != 0 {
			t.Errorf("%+v: %d wire calls, skips %+v; want %d and none (attempts ran out, or retry is off)",
				tc.o, base.n(), skips, tc.want)
		}
	}
}

// TestOverrideNarrowsASetWithoutAmplifiers: a set that neither retries nor
// hedges makes one wire call whatever the override asks.
func TestOverrideNarrowsASetWithoutAmplifiers(t *testing.T) {
	base := &script{codes: []int{503}}
	tr := mustNew(t, Config{Base: base})
	resp, err := get(t, WithOverride(t.Context(), Override{Attempts: 5}), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if base.n() != 1 {
		t.Fatalf("%d wire calls, want 1", base.n())
	}
}

// TestOverrideStopsHedging: NoHedge, or Attempts 1, sends one leg where
// the call would have been hedged, and no hedge is reported suppressed:
// the caller turned hedging off, no gate stopped it.
func TestOverrideStopsHedging(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      Override
		hedged bool
	}{
		{"no override", Override{}, true},
		{"NoRetry", Override{NoRetry: true}, true},
		{"NoHedge", Override{NoHedge: true}, false},
		{"Attempts 1", Override{Attempts: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				set := hedgeSet()
				set.Retry = &policy.Retry{}
				tr, base, ev := warmHedging(t, set)
				warmed, quiet := base.calls.Load(), suppressions(ev)
				base.slowOnce(time.Second)
				start := time.Now()
				code, err := do(t, WithOverride(t.Context(), tc.o), tr)
				if err != nil || code != 200 {
					t.Fatalf("got %d, %v", code, err)
				}
				started, _ := ev.counts()
				if hedged := started == 1; hedged != tc.hedged {
					t.Fatalf("%d hedges started, want hedged %v", started, tc.hedged)
				}
				if tc.hedged {
					return
				}
				if d, n := time.Since(start), base.calls.Load()-warmed; d != time.Second || n != 1 {
					t.Fatalf("%d wire calls in %v; want the one slow leg", n, d)
				}
				if n := suppressions(ev) - quiet; n != 0 {
					t.Fatalf("%d hedges reported suppressed; want none", n)
				}
			})
		})
	}
}

// suppressions returns how many hedges ev saw suppressed, for any reason.
func suppressions(ev *hedgeEvents) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, k := range ev.suppressed {
		n += k
	}
	return n
}

// hang is a base that answers nothing until its request's context ends.
var hang = fakeRT(func(r *http.Request) (*http.Response, error) {
	<-r.Context().Done()
	return nil, r.Context().Err()
})

// TestOverridePerAttemptNarrowsNeverWidens: Override.PerAttempt shortens
// the set's per-attempt timeout for one call, or sets one where the set
// has none; a longer one gets the set's.
func TestOverridePerAttemptNarrowsNeverWidens(t *testing.T) {
	timeout := &policy.Timeout{PerAttempt: 2 * time.Second}
	for _, tc := range []struct {
		name    string
		timeout *policy.Timeout
		o       Override
		want    time.Duration
	}{
		{"the set's", timeout, Override{}, 2 * time.Second},
		{"shorter", timeout, Override{PerAttempt: 500 * time.Millisecond}, 500 * time.Millisecond},
		{"longer", timeout, Override{PerAttempt: 5 * time.Second}, 2 * time.Second},
		{"none in the set", nil, Override{PerAttempt: time.Second}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := mustNew(t, Config{Base: hang, Policies: policy.Set{Timeout: tc.timeout}})
				start := time.Now()
				_, err := get(t, WithOverride(t.Context(), tc.o), tr, "http://a.test/")
				if !errors.Is(err, policy.ErrAttemptTimeout) || time.Since(start) != tc.want {
					t.Fatalf("err = %v after %v, want an attempt timeout after %v", err, time.Since(start), tc.want)
				}
				if want := "after " + tc.want.String(); !strings.HasSuffix(err.Error(), want) {
					t.Fatalf("err = %q, want it to end %q", err, want)
				}
			})
		})
	}
}

// TestOverridePerAttemptAppliesToRetries: every wire attempt of the call
// gets the shorter timeout, not only the first.
func TestOverridePerAttemptAppliesToRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		set := retrySet()
		set.Timeout = &policy.Timeout{PerAttempt: time.Minute}
		tr := mustNew(t, Config{Base: base, Policies: set})
		start := time.Now()
		_, err := get(t, WithOverride(t.Context(), Override{PerAttempt: time.Second}), tr, "http://a.test/")
		if !errors.Is(err, policy.ErrAttemptTimeout) || sent.Load() != 3 {
			t.Fatalf("err = %v after %d calls", err, sent.Load())
		}
		// Three attempts of 1s, and two backoffs of less than 1ms.
		if d := time.Since(start); d < 3*time.Second || d > 3*time.Second+2*time.Millisecond {
			t.Fatalf("took %v, want three 1s attempts", d)
		}
	})
}

// TestOverrideSharesTheKeysState: an overridden call is still the key's:
// it counts with the key's breaker, and what it taught trips the breaker
// for every call to the key.
func TestOverrideSharesTheKeysState(t *testing.T) {
	base := &script{codes: []int{503}}
	set := retrySet()
	set.Breaker = &policy.Breaker{ConsecutiveFailures: 2}
	tr := mustNew(t, Config{Base: base, Policies: set})
	ctx := WithOverride(t.Context(), Override{NoRetry: true})
	for range 2 {
		resp, err := get(t, ctx, tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if base.n() != 2 {
		t.Fatalf("%d wire calls, want 2", base.n())
	}
	_, err := get(t, t.Context(), tr, "http://a.test/")
	if !errors.Is(err, policy.ErrCircuitOpen) {
		t.Fatalf("err = %v, want the breaker the overridden calls tripped", err)
	}
	if n := tr.scopes.len(); n != 1 {
		t.Fatalf("%d keys, want 1: an override does not move a call to another key", n)
	}
}

// TestWithOverrideKeepsTheNarrowerOfTwo: an override in a context that
// already carries one narrows it further, field by field; it cannot widen
// it either.
func TestWithOverrideKeepsTheNarrowerOfTwo(t *testing.T) {
	for _, tc := range []struct {
		outer, inner, want Override
	}{
		{Override{}, Override{Attempts: 2}, Override{Attempts: 2}},
		{Override{Attempts: 2}, Override{}, Override{Attempts: 2}},
		{Override{Attempts: 2}, Override{Attempts: 3}, Override{Attempts: 2}},
		{Override{Attempts: 3}, Override{Attempts: 2}, Override{Attempts: 2}},
		{Override{NoRetry: true}, Override{NoHedge: true}, Override{NoRetry: true, NoHedge: true}},
		{Override{PerAttempt: time.Second}, Override{PerAttempt: time.Minute}, Override{PerAttempt: time.Second}},
		{Override{PerAttempt: time.Minute}, Override{PerAttempt: time.Second}, Override{PerAttempt: time.Second}},
		{Override{PerAttempt: time.Second}, Override{}, Override{PerAttempt: time.Second}},
		{Override{Attempts: 2}, Override{Attempts: -1}, Override{Attempts: -1}},
	} {
		ctx := WithOverride(WithOverride(context.Background(), tc.outer), tc.inner)
		if got, ok := OverrideFrom(ctx); !ok || got != tc.want {
			t.Errorf("%+v then %+v: %+v, %v; want %+v", tc.outer, tc.inner, got, ok, tc.want)
		}
	}
	if got, ok := OverrideFrom(context.Background()); ok || got != (Override{}) {
		t.Errorf("OverrideFrom(Background) = %+v, %v; want none", got, ok)
	}
}

// TestNegativeOverrideIsAnError: a negative field has no narrowing to
// mean; the call fails before any policy runs, naming the field, and its
// body is closed.
func TestNegativeOverrideIsAnError(t *testing.T) {
	for _, tc := range []struct {
		o    Override
		want string
	}{
		{Override{Attempts: -1}, "resilix: Override.Attempts must be >= 0, got -1"},
		{Override{PerAttempt: -time.Second}, "resilix: Override.PerAttempt must be >= 0, got -1s"},
	} {
		var sent atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) { sent.Add(1); return respond(r, 200), nil })
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		b := &trackedBody{Reader: strings.NewReader("x")}
		req, _ := http.NewRequestWithContext(WithOverride(t.Context(), tc.o), http.MethodPut, "http://a.test/", b)
		resp, err := tr.RoundTrip(req)
		if resp != nil || err == nil || err.Error() != tc.want {
			t.Errorf("%+v: got %v, %v; want the error %q", tc.o, resp, err, tc.want)
		}
		if sent.Load() != 0 || !b.closed.Load() {
			t.Errorf("%+v: %d wire calls, body closed %v; want none, and closed", tc.o, sent.Load(), b.closed.Load())
		}
	}
}

// TestOverriddenPathAllocatesNothingOfItsOwn: reading the override is a
// context lookup, and narrowing allocates nothing (a per-attempt timeout,
// which allocates with or without an override, aside).
func TestOverriddenPathAllocatesNothingOfItsOwn(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return resp, nil })
	ctx := WithOverride(context.Background(), Override{Attempts: 2, NoHedge: true})
	for name, set := range map[string]policy.Set{"bare": {}, "retry": retrySet()} {
		tr := mustNew(t, Config{Base: base, Policies: set})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
		if n := testing.AllocsPerRun(1000, func() { _, _ = tr.RoundTrip(req) }); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
}
