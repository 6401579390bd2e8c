package admission_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

// TestTransportInsideInherits: a resilix transport inside the handler
// inherits the request's priority and deadline from admission, with no
// glue. The handler is a proxy that forwards the incoming headers, an
// untrusted caller's "critical" among them: the transport still sees the
// DefaultPriority admission put in the context, and its call to a slow
// dependency ends at the caller's deadline.
func TestTransportInsideInherits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Second)})
		var mu sync.Mutex
		var calls []policy.CallInfo
		rt, err := transport.New(transport.Config{
			Base:     up.RoundTripper(),
			Policies: policy.Set{Limiter: &policy.Limiter{}},
			Observer: &policy.Observer{CallDone: func(c policy.CallInfo) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, c)
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: rt}
		proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			out, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://dependency.test/", nil)
			out.Header = r.Header.Clone() // forwards Resilix-Priority: critical
			resp, err := client.Do(out)
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					w.WriteHeader(http.StatusGatewayTimeout)
				}
				return
			}
			resp.Body.Close()
		})
		h, err := admission.Handler(proxy, admission.Config{DefaultPriority: shedding.Bulk})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
		r.Header.Set("Resilix-Priority", "critical")
		r.Header.Set("Resilix-Timeout-Ms", "300")
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusGatewayTimeout || time.Since(start) != 300*time.Millisecond {
			t.Errorf("answered %d after %v, want 504 at the caller's deadline, 300ms", w.Code, time.Since(start))
		}
		if len(calls) != 1 || calls[0].Priority != shedding.Bulk || calls[0].Outcome != policy.Canceled {
			t.Errorf("the transport's calls: %+v; want one, Bulk, cut off by the caller's deadline", calls)
		}
		synctest.Wait() // the upstream's handler notices its cancelled context
	})
}

// TestARepeatIsNotRetriedBelow: the attempt rule end to end. A request
// that arrives as its caller's second attempt (Resilix-Attempt: 2) is
// served by a handler whose transport retries a failing dependency up to 4
// times: admission puts the number in the context, and the transport sends
// the call once. The same request as a first attempt is retried.
func TestARepeatIsNotRetriedBelow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
		})
		rt, err := transport.New(transport.Config{
			Base: up.RoundTripper(),
			Policies: policy.Set{
				Attempts: 4,
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Budget:   policy.Budget{Max: 100},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: rt}
		proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			out, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://dependency.test/", nil)
			resp, err := client.Do(out)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		})
		h, err := admission.Handler(proxy, admission.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			attempt string
			wire    int64
		}{{"", 4}, {"1", 4}, {"2", 1}, {"3", 1}} {
			up.ResetStats()
			r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
			if tc.attempt != "" {
				r.Header.Set("Resilix-Attempt", tc.attempt)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if got := up.Stats().Requests; w.Code != http.StatusServiceUnavailable || got != tc.wire {
				t.Errorf("Resilix-Attempt %q: answered %d after %d calls to the dependency, want 503 after %d",
					tc.attempt, w.Code, got, tc.wire)
			}
		}
		if n := rt.Measured("dependency.test").RepeatsSentOnce; n != 2 {
			t.Errorf("RepeatsSentOnce = %d, want 2", n)
		}
	})
}
