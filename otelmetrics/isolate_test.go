package otelmetrics_test

import (
	"net/http"
	"testing"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestIsolatedBreakerState: resilix.breaker.state reads 3 for an isolated
// key, with or without a Breaker, called or not, and 0 once it is
// released; a key without a Breaker that was never isolated has no point.
func TestIsolatedBreakerState(t *testing.T) {
	reader, obs := newObserver(t)
	up := httptestutil.NewUpstream(httptestutil.Options{})
	tr, err := transport.New(transport.Config{
		Base:     up.RoundTripper(),
		PerKey:   map[string]policy.Set{"guarded.test": {Breaker: &policy.Breaker{}}},
		Observer: obs,
	})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for _, u := range []string{"http://guarded.test/", "http://plain.test/"} {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	state := func(key string) (float64, bool) {
		v, ok := collect(t, reader).values["resilix.breaker.state{key="+key+"}"]
		return v, ok
	}
	if _, ok := state("plain.test"); ok {
		t.Fatal("a key without a Breaker has a breaker state")
	}
	for _, key := range []string{"guarded.test", "plain.test", "unseen.test"} {
		if err := tr.Isolate(key); err != nil {
			t.Fatal(err)
		}
		if v, ok := state(key); !ok || v != 3 || policy.BreakerIsolated != 3 {
			t.Errorf("%s isolated: breaker state %v (%v), want 3", key, v, ok)
		}
		if err := tr.Release(key); err != nil {
			t.Fatal(err)
		}
		if v, ok := state(key); !ok || v != 0 {
			t.Errorf("%s released: breaker state %v (%v), want 0", key, v, ok)
		}
	}
}
