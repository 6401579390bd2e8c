package otelmetrics_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// TestStoreGauge: resilix.rate_limit.store is the state of each key's
// shared rate-limit store, as policy.StoreState numbers it; a key whose
// rate limit has no store, or that has none, has no point.
func TestStoreGauge(t *testing.T) {
	reader, obs := newObserver(t)
	obs.Attach(fixedStates{
		"up.test":       {Known: true, HasRateLimit: true, RateLimitStore: policy.StoreUp, RateLimitLeased: 7},
		"fallback.test": {Known: true, HasRateLimit: true, RateLimitStore: policy.StoreFallback},
		"refusing.test": {Known: true, HasRateLimit: true, RateLimitStore: policy.StoreRefusing},
		"local.test":    {Known: true, HasRateLimit: true},
		"none.test":     {Known: true},
	})
	got := collect(t, reader)
	want := map[string]float64{
		"resilix.rate_limit.store{key=up.test}":       1,
		"resilix.rate_limit.store{key=fallback.test}": 2,
		"resilix.rate_limit.store{key=refusing.test}": 3,
	}
	if diff := cmp.Diff(want, got.values); diff != "" {
		t.Errorf("collected (-want +got):\n%s", diff)
	}
	if u := got.units["resilix.rate_limit.store"]; u != "{state}" {
		t.Errorf("unit %q, want {state}", u)
	}
}
