package transport

import (
	"bytes"
	"context"
	"io"
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

// drainBase is okBase for requests with a body: it reads the body to its
// end, with a buffer of its own (one goroutine at a time), and closes it,
// as net/http's transport does.
type drainBase struct{ buf []byte }

func (d *drainBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		for {
			if _, err := r.Body.Read(d.buf); err != nil {
				break
			}
		}
		r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// rewound is a caller's request body that a benchmark rewinds for each
// call, so that the caller allocates nothing: what is counted is
// resilix's.
type rewound struct{ bytes.Reader }

func (*rewound) Close() error { return nil }

// BenchmarkRoundTrip measures one successful call through the chain on a
// fake base, so that only resilix's own cost is on the clock. The PUT
// cases send a 1 KiB body, with GetBody (never called on success) or
// without, when the replay buffer keeps a copy as the base reads it.
// "full" is every policy on with nothing firing: the hedge armed on every
// call (its threshold learned at 10ms) and never due, every gate passing.
// The "/caller-ctx" cases call with a cancellable context, as a server's
// request does, rather than Background; "/caller-deadline" with a deadline
// that comes before PerAttempt would.
func BenchmarkRoundTrip(b *testing.B) {
	timeout := &policy.Timeout{PerAttempt: time.Second}
	payload := bytes.Repeat([]byte("x"), 1<<10)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	deadline, cancelDeadline := context.WithTimeout(context.Background(), time.Hour)
	defer cancelDeadline()
	hour := &policy.Timeout{PerAttempt: 2 * time.Hour}
	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
		put  int             // 0: a GET without body; 1: a PUT with GetBody; 2: a PUT without
		ctx  context.Context // the caller's; nil: Background
	}{
		{"hedge-idle", idleHedge(b, policy.Set{Hedge: &policy.Hedge{}}), 0, nil},
		{"full", idleHedge(b, fullSet()), 0, nil},
		{"full/caller-ctx", idleHedge(b, fullSet()), 0, cancellable},
		{"base", okBase{}, 0, nil},
		{"bare", mustNew(b, Config{Base: okBase{}}), 0, nil},
		{"retry", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}}), 0, nil},
		{"retry+timeout", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Timeout: timeout}}), 0, nil},
		{"retry+breaker+timeout", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: timeout}}), 0, nil},
		{"retry+breaker+timeout/caller-ctx", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: timeout}}), 0, cancellable},
		{"retry+breaker+timeout/caller-deadline", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: hour}}), 0, deadline},
		{"gates", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{},
			Throttler: &policy.Throttler{}, Breaker: &policy.Breaker{}, Limiter: &policy.Limiter{},
			Bulkhead: &policy.Bulkhead{MaxConcurrent: 100}, RateLimit: &policy.RateLimit{PerSecond: 1e9}}}), 0, nil},
		{"retry+observer", mustNew(b, Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}},
			Observer: &policy.Observer{CallDone: func(policy.CallInfo) {}, AttemptDone: func(policy.AttemptInfo) {}}}), 0, nil},
		{"base-put-1KiB", &drainBase{buf: make([]byte, 512)}, 2, nil},
		{"retry-put-1KiB-getbody", mustNew(b, Config{Base: &drainBase{buf: make([]byte, 512)}, Policies: policy.Set{Retry: &policy.Retry{}}}), 1, nil},
		{"retry-put-1KiB-replay", mustNew(b, Config{Base: &drainBase{buf: make([]byte, 512)}, Policies: policy.Set{Retry: &policy.Retry{}}}), 2, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
			if bc.ctx != nil {
				req = req.WithContext(bc.ctx)
			}
			body := new(rewound)
			if bc.put > 0 {
				req.Method, req.Body, req.ContentLength = http.MethodPut, body, int64(len(payload))
			}
			if bc.put == 1 {
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(payload)), nil }
			}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				body.Reset(payload)
				resp, err := bc.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
			reportCPU(b, cpu, b.N)
		})
	}
}

// fullSet is every policy on, none of them in the way of a healthy
// upstream.
func fullSet() policy.Set {
	return policy.Set{
		Retry:     &policy.Retry{},
		Hedge:     &policy.Hedge{},
		Throttler: &policy.Throttler{},
		Breaker:   &policy.Breaker{},
		Limiter:   &policy.Limiter{},
		Bulkhead:  &policy.Bulkhead{MaxConcurrent: 100},
		RateLimit: &policy.RateLimit{PerSecond: 1e9},
		Timeout:   &policy.Timeout{PerAttempt: time.Second},
	}
}

// idleHedge returns a transport with set, which hedges, whose threshold
// has been learned at 10ms over a base that now answers at once: every
// call arms the hedge timer and none fires. It is the cost of hedging
// when it does not hedge.
func idleHedge(b testing.TB, set policy.Set) *Transport {
	var warm atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		if warm.Add(1) <= 30 {
			time.Sleep(10 * time.Millisecond)
		}
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	tr := mustNew(b, Config{Base: base, Policies: set})
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

// reportCPU reports the process's CPU time since start (see cpuTime) per
// call, as cpu-ns/op, when it can be read.
func reportCPU(b *testing.B, start time.Duration, calls int) {
	if start == 0 || calls == 0 {
		return
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(calls), "cpu-ns/op")
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

// BenchmarkRequestCopy is what a leg's copy of the caller's request costs:
// the shallow copy every timed attempt makes (WithContext), and the deep
// one (Clone: headers, URL and the rest copied too) that a leg needs when
// it may go on after RoundTrip returns, as a hedge leg does. A first leg
// sent from a goroutine of its own, so that it could outlive a lost round
// as a hedge leg does, would pay the deep copy on every call.
func BenchmarkRequestCopy(b *testing.B) {
	req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
	req.Header.Set("User-Agent", "Go-http-client/1.1")
	ctx := context.Background()
	b.Run("WithContext", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkRequest = req.WithContext(ctx)
		}
	})
	b.Run("Clone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkRequest = req.Clone(ctx)
		}
	})
}

// sinkRequest keeps BenchmarkRequestCopy's copies from being optimised away.
var sinkRequest *http.Request
