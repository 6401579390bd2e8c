package benchmarks

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// Every client under comparison is built here, so that the configuration
// each peer gets is written once and README.md can quote it.

// hedger builds a hedging RoundTripper over base. calmP95 is the p95 a
// plain net/http client measured against the calm upstream: what a user
// reads off a dashboard and types into a fixed hedge delay.
type hedger struct {
	name string
	new  func(tb testing.TB, base http.RoundTripper, calmP95 time.Duration) http.RoundTripper
}

var hedgers = []hedger{
	{"resilix-p95", func(tb testing.TB, base http.RoundTripper, _ time.Duration) http.RoundTripper {
		return mustResilix(tb, base, policy.Set{Hedge: &policy.Hedge{Quantile: 0.95}})
	}},
	{"failsafe-fixed-p95", func(_ testing.TB, base http.RoundTripper, calmP95 time.Duration) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelay[*http.Response](calmP95))
	}},
	{"failsafe-fixed-p95-budget", func(_ testing.TB, base http.RoundTripper, calmP95 time.Duration) http.RoundTripper {
		hp := hedgepolicy.NewBuilderWithDelay[*http.Response](calmP95).WithBudget(budget.New()).Build()
		return failsafehttp.NewRoundTripper(base, hp)
	}},
	// failsafe-go's own dynamic delay: a streaming p95 estimate (Jambon's
	// windowless moving percentile) over recent attempt durations. 30 and
	// 20 are the age and threshold failsafe-go's own tests use; its docs
	// recommend no value. An age of 300 samples is the better setting for
	// these upstreams (see README.md), so both are measured.
	{"failsafe-quantile-p95", func(_ testing.TB, base http.RoundTripper, _ time.Duration) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelayQuantile[*http.Response](0.95, 30, 20))
	}},
	{"failsafe-quantile-p95-age300", func(_ testing.TB, base http.RoundTripper, _ time.Duration) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelayQuantile[*http.Response](0.95, 300, 20))
	}},
}

// The retry configurations of the dead-upstream benchmark: three wire
// calls at most per call, short backoffs so the benchmark is fast.
const (
	retryBase = time.Millisecond
	retryMax  = 5 * time.Millisecond
)

type retrier struct {
	name string
	new  func(tb testing.TB, base http.RoundTripper) http.RoundTripper
}

var retriers = []retrier{
	{"resilix", func(tb testing.TB, base http.RoundTripper) http.RoundTripper {
		return mustResilix(tb, base, resilixRetry())
	}},
	{"failsafe", func(_ testing.TB, base http.RoundTripper) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, failsafeRetry(false))
	}},
	{"failsafe-budget", func(_ testing.TB, base http.RoundTripper) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, failsafeRetry(true))
	}},
	{"retryablehttp", func(_ testing.TB, base http.RoundTripper) http.RoundTripper {
		return &retryablehttp.RoundTripper{Client: retryableClient(base)}
	}},
}

// resilixRetry is Retry with Attempts 3 and the default budget (20% of
// calls, 10 tokens a second, 10 at most; a retry that succeeds refunds).
func resilixRetry() policy.Set {
	return policy.Set{Attempts: 3, Retry: &policy.Retry{BaseDelay: retryBase, MaxDelay: retryMax}}
}

// failsafeRetry is failsafehttp's HTTP retry policy (it retries 429, 5xx
// but 501, and transport errors) at three attempts with exponential
// backoff; with budget, failsafe-go's budget.New() (at most 20% of the
// executions in flight may be retries, and at least 3).
func failsafeRetry(withBudget bool) failsafe.Policy[*http.Response] {
	b := failsafehttp.NewRetryPolicyBuilder().WithMaxAttempts(3).WithBackoff(retryBase, retryMax)
	if withBudget {
		b = b.WithBudget(budget.New())
	}
	return b.Build()
}

// retryableClient is go-retryablehttp at RetryMax 2 (three attempts),
// DefaultRetryPolicy and DefaultBackoff, over an http.Client on base. The
// default logger writes every attempt to stderr; it is off here.
func retryableClient(base http.RoundTripper) *retryablehttp.Client {
	return &retryablehttp.Client{
		HTTPClient:   &http.Client{Transport: base},
		RetryMax:     2,
		RetryWaitMin: retryBase,
		RetryWaitMax: retryMax,
		CheckRetry:   retryablehttp.DefaultRetryPolicy,
		Backoff:      retryablehttp.DefaultBackoff,
	}
}

// limiterPeer builds an adaptive concurrency limiter over base, for
// calls to host: the RoundTripper, a test of its refusals, and a reading
// of its current limit.
type limiterPeer struct {
	name string
	new  func(tb testing.TB, base http.RoundTripper, host string) (rt http.RoundTripper, refused func(error) bool, limit func() int)
}

var limiterPeers = []limiterPeer{
	// policy.Set{Limiter: &policy.Limiter{}}: initial limit 20, between 1
	// and 1000, a priority queue of 0.5 × limit.
	{"resilix", func(tb testing.TB, base http.RoundTripper, host string) (http.RoundTripper, func(error) bool, func() int) {
		tr := mustResilix(tb, base, policy.Set{Limiter: &policy.Limiter{}})
		return tr, func(err error) bool { return errors.Is(err, policy.ErrRejected) },
			func() int { return tr.Measured(host).LimiterLimit }
	}},
	// adaptivelimiter.NewWithDefaults: initial limit 20, between 1 and 200,
	// at most 5 × in flight, no queue (a call over the limit is refused at
	// once with ErrExceeded), the limit reconsidered at most once a second
	// over at least 50 calls.
	{"failsafe", func(_ testing.TB, base http.RoundTripper, _ string) (http.RoundTripper, func(error) bool, func() int) {
		lim := adaptivelimiter.NewWithDefaults[*http.Response]()
		return failsafehttp.NewRoundTripper(base, lim), func(err error) bool { return errors.Is(err, adaptivelimiter.ErrExceeded) },
			lim.Limit
	}},
}

func mustResilix(tb testing.TB, base http.RoundTripper, set policy.Set) *transport.Transport {
	tb.Helper()
	tr, err := transport.New(transport.Config{Base: base, Policies: set})
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// reportLoad reports a load as resilix's own loopback benchmarks do: one
// op is a whole load, so ns/op is zeroed, and the figures are latency
// quantiles in milliseconds and the extra wire calls in percent of calls.
func reportLoad(b *testing.B, res httptestutil.LoadResult, wire int64) {
	b.ReportMetric(ms(res.Quantile(0.5)), "p50-ms")
	b.ReportMetric(ms(res.Quantile(0.99)), "p99-ms")
	b.ReportMetric(ms(res.Quantile(0.999)), "p99.9-ms")
	n := int64(len(res.Latencies))
	b.ReportMetric(100*float64(wire-n)/float64(n), "extra-%")
	b.ReportMetric(0, "ns/op")
}
