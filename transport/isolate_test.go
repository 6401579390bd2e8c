package transport

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// transitions records the BreakerTransitions an Observer hears.
type transitions struct {
	mu  sync.Mutex
	got []policy.BreakerTransition
}

func (r *transitions) observer() *policy.Observer {
	return &policy.Observer{BreakerTransition: func(bt policy.BreakerTransition) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got = append(r.got, bt)
	}}
}

// take returns the transitions heard since the last take, without their
// contexts, having checked that each had one.
func (r *transitions) take(t *testing.T) []policy.BreakerTransition {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	for i := range got {
		if got[i].Context == nil {
			t.Errorf("transition %+v has a nil Context", got[i])
		}
		got[i].Context = nil
	}
	return got
}

func wantIsolated(t *testing.T, err error, key string) {
	t.Helper()
	var rej *policy.RejectedError
	if !errors.Is(err, policy.ErrIsolated) || !errors.Is(err, policy.ErrCircuitOpen) || !errors.Is(err, policy.ErrRejected) || !errors.As(err, &rej) {
		t.Fatalf("err = %v, want a *RejectedError matching ErrIsolated and ErrCircuitOpen", err)
	}
	if rej.Gate != policy.GateBreaker || rej.Key != key || rej.RetryAfter != 0 {
		t.Fatalf("refusal %+v, want GateBreaker, key %q and no RetryAfter", *rej, key)
	}
}

// TestIsolateRefusesWithoutAWireCall: an isolated key's calls are refused
// before any gate and never reach the upstream, however the key is
// spelled; released, they flow again, and the snapshot and the Observer
// follow.
func TestIsolateRefusesWithoutAWireCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{})
		var seen transitions
		obs := seen.observer()
		var refused []policy.Refusal
		obs.Refused = func(r policy.Refusal) { refused = append(refused, r) }
		tr := mustNew(t, Config{Base: up.RoundTripper(), Observer: obs, Policies: policy.Set{
			Retry:     &policy.Retry{},
			Throttler: &policy.Throttler{},
			Breaker:   &policy.Breaker{},
			Limiter:   &policy.Limiter{},
		}})
		if err := getClose(t, tr, "http://api.test/"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Isolate("API.test.:443"); err != nil {
			t.Fatal(err)
		}
		if m := tr.Measured("api.test"); !m.HasBreaker || m.BreakerState != policy.BreakerIsolated {
			t.Fatalf("Measured after Isolate: %+v, want an isolated breaker", m)
		}
		for range 3 {
			wantIsolated(t, getClose(t, tr, "http://api.test/x"), "api.test")
		}
		if n := up.Stats().Requests; n != 1 {
			t.Fatalf("%d requests reached the upstream, want the 1 before the isolation", n)
		}
		if len(refused) != 3 || !errors.Is(refused[0].Err, policy.ErrIsolated) || refused[0].Gate != policy.GateBreaker {
			t.Fatalf("Refused heard %+v, want 3 refusals by the breaker with ErrIsolated", refused)
		}
		if err := tr.Isolate("api.test"); err != nil { // again: nothing to do
			t.Fatal(err)
		}
		if err := tr.Release("api.test:80"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Release("api.test"); err != nil { // not isolated: nothing to do
			t.Fatal(err)
		}
		if err := getClose(t, tr, "http://api.test/"); err != nil {
			t.Fatal(err)
		}
		if n := up.Stats().Requests; n != 2 {
			t.Fatalf("%d requests reached the upstream, want 2", n)
		}
		if m := tr.Measured("api.test"); m.BreakerState != policy.BreakerClosed {
			t.Fatalf("Measured after Release: %+v, want closed", m)
		}
		want := []policy.BreakerTransition{
			{Key: "api.test", From: policy.BreakerClosed, To: policy.BreakerIsolated},
			{Key: "api.test", From: policy.BreakerIsolated, To: policy.BreakerClosed},
		}
		if diff := cmp.Diff(want, seen.take(t)); diff != "" {
			t.Fatalf("transitions (-want +got):\n%s", diff)
		}
	})
}

// TestIsolateAKeyNeverSeen: a key can be isolated before its first call,
// with or without a Breaker, and with a Key func; its first call is
// refused.
func TestIsolateAKeyNeverSeen(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		key  string
		url  string
	}{
		{"breaker", Config{Policies: policy.Set{Breaker: &policy.Breaker{}}}, "new.test", "http://NEW.test/"},
		{"no breaker", Config{}, "new.test:8080", "http://new.test:08080/"},
		{"key func", Config{Key: func(r *http.Request) string { return "tenant " + r.URL.Path }}, "tenant /a", "http://x.test/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := httptestutil.NewUpstream(httptestutil.Options{})
				var seen transitions
				tc.cfg.Base, tc.cfg.Observer = up.RoundTripper(), seen.observer()
				tr := mustNew(t, tc.cfg)
				if err := tr.Isolate(tc.key); err != nil {
					t.Fatal(err)
				}
				m := tr.Measured(tc.key)
				if !m.Known || !m.HasBreaker || m.BreakerState != policy.BreakerIsolated {
					t.Fatalf("Measured(%q) = %+v, want an isolated breaker", tc.key, m)
				}
				wantIsolated(t, getClose(t, tr, tc.url), tc.key)
				if n := up.Stats().Requests; n != 0 {
					t.Fatalf("%d requests reached the upstream, want 0", n)
				}
				if err := tr.Release(tc.key); err != nil {
					t.Fatal(err)
				}
				if err := getClose(t, tr, tc.url); err != nil {
					t.Fatal(err)
				}
				want := []policy.BreakerTransition{
					{Key: tc.key, From: policy.BreakerClosed, To: policy.BreakerIsolated},
					{Key: tc.key, From: policy.BreakerIsolated, To: policy.BreakerClosed},
				}
				if diff := cmp.Diff(want, seen.take(t)); diff != "" {
					t.Fatalf("transitions (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestIsolateNamesAHost: with the default Key, the operator's methods take
// a host[:port] as PerKey does, and anything else is an error that creates
// no state.
func TestIsolateNamesAHost(t *testing.T) {
	tr := mustNew(t, Config{Base: fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })})
	for _, key := range []string{"", "https://api.test", "api.test/x", "api.test:99999", "a b"} {
		for name, f := range map[string]func(string) error{"Isolate": tr.Isolate, "Release": tr.Release, "ResetBreaker": tr.ResetBreaker} {
			if err := f(key); err == nil {
				t.Errorf("%s(%q) = nil, want an error", name, key)
			}
		}
	}
	if n := tr.scopes.len(); n != 0 {
		t.Fatalf("%d scopes after invalid keys, want 0", n)
	}
	// Release and ResetBreaker of a key with no state do nothing.
	if err := tr.Release("api.test"); err != nil {
		t.Fatal(err)
	}
	if err := tr.ResetBreaker("api.test"); err != nil {
		t.Fatal(err)
	}
	if n := tr.scopes.len(); n != 0 {
		t.Fatalf("%d scopes after Release and ResetBreaker, want 0", n)
	}
}

// TestResetBreakerClosesAnOpenBreaker: a breaker open for a minute closes
// at once, and calls flow; ResetBreaker leaves an isolated key isolated.
func TestResetBreakerClosesAnOpenBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Faults: []httptestutil.Fault{{Probability: 1, Status: 503}}})
		var seen transitions
		tr := mustNew(t, Config{Base: up.RoundTripper(), Observer: seen.observer(), Policies: policy.Set{
			Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenFor: time.Minute, FirstOpenFor: -1},
		}})
		if err := getClose(t, tr, "http://api.test/"); err != nil {
			t.Fatal(err) // the 503, given back
		}
		if err := getClose(t, tr, "http://api.test/"); !errors.Is(err, policy.ErrCircuitOpen) || errors.Is(err, policy.ErrIsolated) {
			t.Fatalf("after the trip: %v, want ErrCircuitOpen and not ErrIsolated", err)
		}
		up.SetFaults() // fixed
		if err := tr.ResetBreaker("api.test"); err != nil {
			t.Fatal(err)
		}
		if m := tr.Measured("api.test"); m.BreakerState != policy.BreakerClosed || m.ErrorRate != 0 {
			t.Fatalf("Measured after ResetBreaker: %+v, want closed with an empty window", m)
		}
		resp, err := get(t, t.Context(), tr, "http://api.test/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("after ResetBreaker: %v, %v; want a 200", resp, err)
		}
		resp.Body.Close()
		if err := tr.ResetBreaker("api.test"); err != nil { // closed: nothing to do
			t.Fatal(err)
		}
		if err := tr.Isolate("api.test"); err != nil {
			t.Fatal(err)
		}
		if err := tr.ResetBreaker("api.test"); err == nil {
			t.Fatal("ResetBreaker of an isolated key = nil, want an error")
		}
		wantIsolated(t, getClose(t, tr, "http://api.test/"), "api.test")
		want := []policy.BreakerTransition{
			{Key: "api.test", From: policy.BreakerClosed, To: policy.BreakerOpen},
			{Key: "api.test", From: policy.BreakerOpen, To: policy.BreakerClosed},
			{Key: "api.test", From: policy.BreakerClosed, To: policy.BreakerIsolated},
		}
		if diff := cmp.Diff(want, seen.take(t)); diff != "" {
			t.Fatalf("transitions (-want +got):\n%s", diff)
		}
	})
}

// TestACallInFlightWhenIsolatedFinishes: a call on the wire when the key is
// isolated gets its answer; its failure teaches the breaker nothing, and
// its retry is refused, leaving the caller the answer.
func TestACallInFlightWhenIsolatedFinishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(time.Second),
			Faults:  []httptestutil.Fault{{Probability: 1, Status: 503}},
		})
		var seen transitions
		tr := mustNew(t, Config{Base: up.RoundTripper(), Observer: seen.observer(), Policies: policy.Set{
			Retry:   &policy.Retry{},
			Breaker: &policy.Breaker{ConsecutiveFailures: 1},
		}})
		done := make(chan *http.Response)
		go func() {
			resp, err := get(t, context.Background(), tr, "http://api.test/")
			if err != nil {
				t.Error(err)
			}
			done <- resp
		}()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if err := tr.Isolate("api.test"); err != nil {
			t.Fatal(err)
		}
		resp := <-done
		if resp == nil || resp.StatusCode != 503 {
			t.Fatalf("the call in flight got %v, want its 503", resp)
		}
		resp.Body.Close()
		if n := up.Stats().Requests; n != 1 {
			t.Fatalf("%d requests, want 1: the retry is refused", n)
		}
		if err := tr.Release("api.test"); err != nil {
			t.Fatal(err)
		}
		// The 503 of the isolated generation tripped nothing: one
		// consecutive failure was enough to.
		want := []policy.BreakerTransition{
			{Key: "api.test", From: policy.BreakerClosed, To: policy.BreakerIsolated},
			{Key: "api.test", From: policy.BreakerIsolated, To: policy.BreakerClosed},
		}
		if diff := cmp.Diff(want, seen.take(t)); diff != "" {
			t.Fatalf("transitions (-want +got):\n%s", diff)
		}
	})
}

// TestIsolatedKeyIsNotEvicted: under MaxKeys pressure an isolated key is
// kept, and stays refused; at most MaxKeys keys can be isolated at once.
func TestIsolatedKeyIsNotEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{})
		tr := mustNew(t, Config{Base: up.RoundTripper(), MaxKeys: 2})
		if err := tr.Isolate("dead.test"); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := getClose(t, tr, "http://h"+strconv.Itoa(i)+".test/"); err != nil {
				t.Fatal(err)
			}
		}
		if m := tr.Measured("dead.test"); m.BreakerState != policy.BreakerIsolated {
			t.Fatalf("after 50 other hosts: %+v, want dead.test isolated", m)
		}
		wantIsolated(t, getClose(t, tr, "http://dead.test/"), "dead.test")
		if n := tr.scopes.len(); n != 2 {
			t.Fatalf("%d scopes, want MaxKeys = 2", n)
		}
		if err := tr.Isolate("other.test"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Isolate("third.test"); err == nil {
			t.Fatal("a third isolation with MaxKeys 2 = nil, want an error")
		}
		if tr.Measured("third.test").Known {
			t.Fatal("a refused isolation created state")
		}
		if err := tr.Release("dead.test"); err != nil {
			t.Fatal(err)
		}
		if err := tr.Isolate("third.test"); err != nil {
			t.Fatalf("an isolation after a release: %v", err)
		}
		// dead.test, released, is quiet again: it goes first.
		if err := getClose(t, tr, "http://h99.test/"); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]bool{"dead.test": false, "other.test": true, "third.test": true, "h99.test": true} {
			if got := tr.Measured(key).Known; got != want {
				t.Errorf("Measured(%q).Known = %v, want %v", key, got, want)
			}
		}
	})
}

// TestIsolateConcurrently: isolations and releases racing calls leave
// every call with a response or a refusal by isolation, and the count of
// isolated keys right.
func TestIsolateConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Millisecond)})
		tr := mustNew(t, Config{Base: up.RoundTripper(), MaxKeys: 4, Policies: policy.Set{Breaker: &policy.Breaker{}}})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for range 50 {
					if err := getClose(t, tr, "http://api.test/"); err != nil && !errors.Is(err, policy.ErrIsolated) {
						t.Error(err)
					}
				}
			})
			wg.Go(func() {
				for i := range 20 {
					if (g+i)%2 == 0 {
						_ = tr.Isolate("api.test")
					} else {
						_ = tr.Release("api.test")
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		if err := tr.Release("api.test"); err != nil {
			t.Fatal(err)
		}
		if n := tr.scopes.isolated; n != 0 {
			t.Fatalf("%d keys counted isolated after the last release, want 0", n)
		}
	})
}
