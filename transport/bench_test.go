package transport

import (
	"net/http"
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
		{"base", okBase{}},
		{"bare", mustNew(b, Config{Base: okBase{}})},
		{"retry", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}})},
		{"retry+timeout", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Timeout: timeout}})},
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
