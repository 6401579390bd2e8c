package transport

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// okBase answers every request with a fresh 200 and no body: the
// allocations net/http's own transport would make for a response are one
// here, so what a benchmark reports beyond one is resilix's.
type okBase struct{}

func (okBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// BenchmarkRoundTrip measures one successful call through the chain on a
// fake base, so that only resilix's own cost is on the clock.
func BenchmarkRoundTrip(b *testing.B) {
	timeout := &policy.Timeout{PerAttempt: time.Second}
	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"hedge-idle", idleHedge(b)},
		{"base", okBase{}},
		{"bare", mustNew(b, Config{Base: okBase{}})},
		{"retry", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}})},
		{"retry+timeout", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Timeout: timeout}})},
		{"gates", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{},
			Throttler: &policy.Throttler{}, Breaker: &policy.Breaker{}, Limiter: &policy.Limiter{},
			Bulkhead: &policy.Bulkhead{MaxConcurrent: 100}, RateLimit: &policy.RateLimit{PerSecond: 1e9}}})},
		{"retry+observer", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}},
			Observer: &policy.Observer{CallDone: func(policy.CallInfo) {}, AttemptDone: func(policy.AttemptInfo) {}}})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := bc.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// idleHedge returns a hedging transport whose threshold has been learned at
// 10ms over a base that now answers at once: every call arms the hedge
// timer and none fires. It is the cost of hedging when it does not hedge.
func idleHedge(b *testing.B) *Transport {
	var warm atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		if warm.Add(1) <= 30 {
			time.Sleep(10 * time.Millisecond)
		}
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	tr := mustNew(b, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{}}})
	req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
	for range 30 {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	if tr.Measured("a.test").HedgeThreshold < 5*time.Millisecond {
		b.Fatal("the hedge threshold was not learned")
	}
	return tr
}

// BenchmarkRoundTripParallel is the retry chain under contention on one key.
func BenchmarkRoundTripParallel(b *testing.B) {
	tr := mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
		for pb.Next() {
			resp, err := tr.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
}
