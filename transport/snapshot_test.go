package transport

import (
	"net/http"
	"runtime"
	"slices"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// presence is the part of a snapshot that says which policies a key runs.
type presence struct {
	Known, Hedge, Budget, Throttler, Breaker, Limiter, Bulkhead, RateLimit bool
}

func presenceOf(s policy.Snapshot) presence {
	return presence{s.Known, s.HasHedge, s.HasBudget, s.HasThrottler, s.HasBreaker, s.HasLimiter, s.HasBulkhead, s.HasRateLimit}
}

// TestMeasuredSaysWhichPoliciesAKeyRuns checks that a snapshot tells a
// policy that is off apart from one in its zero state: a key without a
// breaker reports no breaker, not a closed one, and so on for each policy.
// The StateSource an Observer is given reports the same snapshots.
func TestMeasuredSaysWhichPoliciesAKeyRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		all := policy.Set{
			Retry:     &policy.Retry{},
			Hedge:     &policy.Hedge{},
			Throttler: &policy.Throttler{},
			Breaker:   &policy.Breaker{},
			Limiter:   &policy.Limiter{},
			Bulkhead:  &policy.Bulkhead{MaxConcurrent: 4},
			RateLimit: &policy.RateLimit{PerSecond: 1000},
		}
		cases := []struct {
			key  string
			set  policy.Set
			want presence
		}{
			{"none.test", policy.Set{}, presence{Known: true}},
			{"retry.test", policy.Set{Retry: all.Retry}, presence{Known: true, Budget: true}},
			{"hedge.test", policy.Set{Hedge: all.Hedge}, presence{Known: true, Hedge: true, Budget: true}},
			{"throttler.test", policy.Set{Throttler: all.Throttler}, presence{Known: true, Throttler: true}},
			{"breaker.test", policy.Set{Breaker: all.Breaker}, presence{Known: true, Breaker: true}},
			{"limiter.test", policy.Set{Limiter: all.Limiter}, presence{Known: true, Limiter: true}},
			{"bulkhead.test", policy.Set{Bulkhead: all.Bulkhead}, presence{Known: true, Bulkhead: true}},
			{"ratelimit.test", policy.Set{RateLimit: all.RateLimit}, presence{Known: true, RateLimit: true}},
			{"all.test", all, presence{true, true, true, true, true, true, true, true}},
		}
		perKey := map[string]policy.Set{}
		for _, c := range cases {
			perKey[c.key] = c.set
		}
		var src policy.StateSource
		tr := mustNew(t, Config{
			Base:     okBase{},
			PerKey:   perKey,
			Observer: &policy.Observer{Attach: func(s policy.StateSource) { src = s }},
		})
		for _, c := range cases {
			resp, err := tr.RoundTrip(mustRequest(t, "http://"+c.key+"/"))
			if err != nil {
				t.Fatalf("%s: %v", c.key, err)
			}
			resp.Body.Close()
		}

		if got := tr.Measured("never.test"); got != (policy.Snapshot{}) {
			t.Errorf("Measured of a key never called = %+v, want the zero Snapshot", got)
		}
		if got := tr.Measured("none.test"); got != (policy.Snapshot{Known: true}) {
			t.Errorf("Measured of a key with no policy = %+v, want only Known", got)
		}
		for _, c := range cases {
			m := tr.Measured(c.key)
			if diff := cmp.Diff(c.want, presenceOf(m)); diff != "" {
				t.Errorf("%s: presence (-want +got):\n%s", c.key, diff)
			}
			if m.HasBreaker && m.BreakerState != policy.BreakerClosed {
				t.Errorf("%s: breaker %v after one success", c.key, m.BreakerState)
			}
		}

		// The source reports the snapshots Measured returns: time stands
		// still in the bubble, so they are equal field for field.
		reported := map[string]policy.Snapshot{}
		src.States(func(key string, s policy.Snapshot) { reported[key] = s })
		for _, c := range cases {
			if diff := cmp.Diff(tr.Measured(c.key), reported[c.key]); diff != "" {
				t.Errorf("%s: States (-Measured +States):\n%s", c.key, diff)
			}
		}
		if len(reported) != len(cases) {
			t.Errorf("States reported %d keys, want %d", len(reported), len(cases))
		}
	})
}

// TestSnapshotAllocatesNothing: an observer reads every key's snapshot on
// each collection.
func TestSnapshotAllocatesNothing(t *testing.T) {
	tr := mustNew(t, Config{Base: okBase{}, Policies: policy.Set{
		Retry:     &policy.Retry{},
		Hedge:     &policy.Hedge{},
		Throttler: &policy.Throttler{},
		Breaker:   &policy.Breaker{},
		Limiter:   &policy.Limiter{},
		Bulkhead:  &policy.Bulkhead{MaxConcurrent: 4},
		RateLimit: &policy.RateLimit{PerSecond: 1000},
	}})
	for range 50 {
		resp, err := tr.RoundTrip(mustRequest(t, "http://a.test/"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	s := tr.scopes.lookup("a.test")
	now := time.Now()
	if n := testing.AllocsPerRun(100, func() { _ = s.snapshot(now) }); n != 0 {
		t.Errorf("scope.snapshot allocates %v times, want 0", n)
	}
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestAnObserverDoesNotKeepItsTransportsAlive: an Observer that keeps
// every source it is given (as otelmetrics does) keeps no transport alive,
// and a source reports when its transport is gone.
func TestAnObserverDoesNotKeepItsTransportsAlive(t *testing.T) {
	var kept []policy.StateSource
	obs := &policy.Observer{Attach: func(s policy.StateSource) { kept = append(kept, s) }}
	build := func() weak.Pointer[Transport] {
		tr := mustNew(t, Config{Base: okBase{}, Observer: obs, Policies: policy.Set{
			Retry: &policy.Retry{}, Hedge: &policy.Hedge{}, Breaker: &policy.Breaker{}, Limiter: &policy.Limiter{},
		}})
		for _, u := range []string{"http://a.test/", "http://b.test/"} {
			resp, err := tr.RoundTrip(mustRequest(t, u))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		return weak.Make(tr)
	}
	live := mustNew(t, Config{Base: okBase{}, Observer: obs, Policies: policy.Set{Breaker: &policy.Breaker{}}})
	resp, err := live.RoundTrip(mustRequest(t, "http://live.test/"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	gone := build()
	for range 3 {
		runtime.GC()
	}
	if gone.Value() != nil {
		t.Fatal("a dropped transport is still alive: its observer keeps it")
	}
	if len(kept) != 2 {
		t.Fatalf("Attach called %d times, want 2", len(kept))
	}
	var keys []string
	alive := kept[0].States(func(key string, s policy.Snapshot) { keys = append(keys, key) })
	if !alive || !slices.Equal(keys, []string{"live.test"}) {
		t.Errorf("the live transport's source: alive %v, keys %q; want true, [live.test]", alive, keys)
	}
	called := false
	if kept[1].States(func(string, policy.Snapshot) { called = true }) || called {
		t.Errorf("the dropped transport's source reports it alive, or calls f")
	}
	runtime.KeepAlive(live)
}
