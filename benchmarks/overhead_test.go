package benchmarks

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/resilix/resilix/policy"
)

// okBase answers every request with a fresh 200 and no body, counting the
// calls. While slow is set it takes 10ms, which is how the hedging
// variants are taught a latency that the benchmark's calls then beat: the
// hedge is armed on every call and never fires.
type okBase struct {
	calls atomic.Int64
	slow  atomic.Bool
}

func (o *okBase) RoundTrip(r *http.Request) (*http.Response, error) {
	o.calls.Add(1)
	if o.slow.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
}

// BenchmarkSuccessOverhead measures one successful GET through each
// library's RoundTripper on an in-process base, so that only the library's
// own cost is on the clock. The base costs one allocation, the
// *http.Response. wire/op checks that no variant sent more than one call.
//
//	go test -run '^$' -bench SuccessOverhead -count 5
func BenchmarkSuccessOverhead(b *testing.B) {
	for _, bc := range []struct {
		name  string
		new   func(b *testing.B, base *okBase) http.RoundTripper
		learn bool // teach a 10ms latency first
	}{
		{name: "base", new: func(_ *testing.B, base *okBase) http.RoundTripper { return base }},
		{name: "net-http-client", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return clientRT{&http.Client{Transport: base}}
		}},
		{name: "resilix/retry", new: func(b *testing.B, base *okBase) http.RoundTripper {
			return mustResilix(b, base, resilixRetry())
		}},
		{name: "failsafe/retry", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, failsafeRetry(false))
		}},
		{name: "retryablehttp/retry", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return &retryablehttp.RoundTripper{Client: retryableClient(base)}
		}},
		{name: "resilix/retry+hedge", learn: true, new: func(b *testing.B, base *okBase) http.RoundTripper {
			set := resilixRetry()
			set.Hedge = &policy.Hedge{Quantile: 0.95}
			return mustResilix(b, base, set)
		}},
		{name: "failsafe/retry+hedge-fixed", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, failsafeRetry(false), hedgepolicy.NewWithDelay[*http.Response](10*time.Millisecond))
		}},
		{name: "resilix/retry+breaker+timeout", new: func(b *testing.B, base *okBase) http.RoundTripper {
			set := resilixRetry()
			set.Breaker, set.Timeout = &policy.Breaker{}, &policy.Timeout{PerAttempt: time.Second}
			return mustResilix(b, base, set)
		}},
		{name: "failsafe/retry+breaker+timeout", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, failsafeRetry(false),
				circuitbreaker.NewWithDefaults[*http.Response](), timeout.New[*http.Response](time.Second))
		}},
		{name: "resilix/all", learn: true, new: func(b *testing.B, base *okBase) http.RoundTripper {
			return mustResilix(b, base, resilixAll())
		}},
		{name: "failsafe/all", new: func(_ *testing.B, base *okBase) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, failsafeAll()...)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			base := &okBase{}
			rt := bc.new(b, base)
			req, err := http.NewRequest(http.MethodGet, "http://a.test/", nil)
			if err != nil {
				b.Fatal(err)
			}
			if bc.learn {
				base.slow.Store(true)
				for range 30 {
					roundTrip(b, rt, req)
				}
				base.slow.Store(false)
			}
			before := base.calls.Load()
			b.ReportAllocs()
			for b.Loop() {
				roundTrip(b, rt, req)
			}
			b.ReportMetric(float64(base.calls.Load()-before)/float64(b.N), "wire/op")
		})
	}
}

func roundTrip(b *testing.B, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
}

// resilixAll is every resilix policy on, none in the way of a healthy
// upstream: the overhead of the whole chain when nothing fires.
func resilixAll() policy.Set {
	set := resilixRetry()
	set.Hedge = &policy.Hedge{Quantile: 0.95}
	set.Throttler = &policy.Throttler{}
	set.Breaker = &policy.Breaker{}
	set.Limiter = &policy.Limiter{}
	set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 100}
	set.RateLimit = &policy.RateLimit{PerSecond: 1e9}
	set.Timeout = &policy.Timeout{PerAttempt: time.Second}
	return set
}

// failsafeAll is failsafe-go's nearest equivalent, outermost first: the
// same retry, a hedge after a fixed 10 ms, its adaptive throttler, circuit
// breaker, adaptive limiter, a bulkhead of 100, a rate limiter of 1e9 a
// second and a 1 s timeout, each with its defaults.
func failsafeAll() []failsafe.Policy[*http.Response] {
	return []failsafe.Policy[*http.Response]{
		failsafeRetry(false),
		hedgepolicy.NewWithDelay[*http.Response](10 * time.Millisecond),
		adaptivethrottler.NewWithDefaults[*http.Response](),
		circuitbreaker.NewWithDefaults[*http.Response](),
		adaptivelimiter.NewWithDefaults[*http.Response](),
		bulkhead.New[*http.Response](100),
		ratelimiter.NewBursty[*http.Response](1e9, time.Second),
		timeout.New[*http.Response](time.Second),
	}
}

// clientRT makes an http.Client a RoundTripper, to price the http.Client
// that go-retryablehttp puts between its RoundTripper and the base.
type clientRT struct{ c *http.Client }

func (c clientRT) RoundTrip(r *http.Request) (*http.Response, error) { return c.c.Do(r) }
