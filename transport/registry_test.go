package transport

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// everyPolicy returns a fresh Set with every policy on, so that two calls
// share nothing.
func everyPolicy() policy.Set {
	return policy.Set{
		Attempts:  3,
		Budget:    policy.Budget{Ratio: 0.2},
		Retry:     &policy.Retry{BaseDelay: time.Millisecond},
		Hedge:     &policy.Hedge{Quantile: 0.9, WinRate: &policy.WinRate{Floor: 0.2}},
		Throttler: &policy.Throttler{K: 3},
		Breaker:   &policy.Breaker{ConsecutiveFailures: 7},
		Limiter:   &policy.Limiter{InitialLimit: 30},
		Bulkhead:  &policy.Bulkhead{MaxConcurrent: 4},
		RateLimit: &policy.RateLimit{PerSecond: 1000},
		Timeout:   &policy.Timeout{PerAttempt: time.Second},
	}
}

// scribble sets every number reachable from v through pointers, structs
// and maps to -1, as a caller reusing its config after New would.
func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			scribble(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			scribble(v.Field(i))
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			scribble(it.Value())
		}
	case reflect.Int, reflect.Int64:
		if v.CanSet() {
			v.SetInt(-1)
		}
	case reflect.Float64:
		if v.CanSet() {
			v.SetFloat(-1)
		}
	}
}

// chainsEqual compares compiled chains field by field, following their
// pointers; funcs compare equal when both are set or both nil.
var chainsEqual = []cmp.Option{
	cmp.AllowUnexported(chain{}),
	cmp.Comparer(func(a, b policy.Classify) bool { return (a == nil) == (b == nil) }),
	cmp.Comparer(func(a, b func(*http.Response, error) bool) bool { return (a == nil) == (b == nil) }),
}

// TestEditingTheConfigAfterNewChangesNothing fails on a Transport that
// keeps a pointer into its Config: scopes are built lazily, from the chain,
// so an edit would reach every scope created after it, unvalidated.
func TestEditingTheConfigAfterNewChangesNothing(t *testing.T) {
	config := func() Config {
		return Config{
			Policies: everyPolicy(),
			PerKey:   map[string]policy.Set{"p.test": everyPolicy()},
		}
	}
	want := mustNew(t, config())

	cfg := config()
	cfg.Base = fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, cfg)
	scribble(reflect.ValueOf(&cfg))
	cfg.PerKey["q.test"] = policy.Set{}
	delete(cfg.PerKey, "p.test")

	if diff := cmp.Diff(want.def, tr.def, chainsEqual...); diff != "" {
		t.Errorf("Policies changed after New (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(want.perKey, tr.perKey, chainsEqual...); diff != "" {
		t.Errorf("PerKey changed after New (-before +after):\n%s", diff)
	}
	// And what the chains build: new scopes after the edit still work.
	for _, host := range []string{"fresh.test", "p.test", "q.test"} {
		resp, err := get(t, t.Context(), tr, "http://"+host+"/")
		if err != nil {
			t.Fatalf("%s after the edit: %v", host, err)
		}
		resp.Body.Close()
	}
}

// TestEditingBulkheadAndRateLimitAfterNew is the report's repro: with the
// Bulkhead and RateLimit kept by pointer, PerSecond = 0 after New refused
// every call to a new host ("retry after 2562047h"), and MaxConcurrent = 1
// narrowed the bulkhead of every new host.
func TestEditingBulkheadAndRateLimitAfterNew(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	bh := &policy.Bulkhead{MaxConcurrent: 2}
	rl := &policy.RateLimit{PerSecond: 100}
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{Bulkhead: bh, RateLimit: rl}})
	bh.MaxConcurrent = 1
	rl.PerSecond = 0

	first, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	second, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatalf("second call with one slot of two held: %v", err)
	}
	second.Body.Close()
}

// TestEditingTheObserverAfterNewChangesNothing: the Observer is a struct of
// funcs the transport calls concurrently; keeping the caller's pointer
// would make an edit after New a data race and change what is reported.
func TestEditingTheObserverAfterNewChangesNothing(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	var calls int
	obs := &policy.Observer{CallDone: func(policy.CallInfo) { calls++ }}
	tr := mustNew(t, Config{Base: base, Observer: obs})
	obs.CallDone = nil
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls != 1 {
		t.Fatalf("CallDone called %d times, want 1", calls)
	}
}
