package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// An Override narrows what the key's set allows for one call: a caller
// that cannot wait for retries, or needs an answer sooner than the set's
// per-attempt timeout. It never widens the set, and the call keeps sharing
// its key's breaker, budget and latency window. The upstream here is in
// memory: /items always answers 503, /slow never answers.
func ExampleWithOverride() {
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	var wire int // the last call's wire attempts
	rt, err := transport.New(transport.Config{
		Base: upstream,
		Policies: policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{Delay: func(int) time.Duration { return time.Millisecond }},
			Timeout:  &policy.Timeout{PerAttempt: 10 * time.Second},
		},
		Observer: &policy.Observer{CallDone: func(c policy.CallInfo) { wire = c.WireAttempts }},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	get := func(ctx context.Context, path string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://inventory.internal"+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%s (wire attempts: %d)\n", resp.Status, wire)
	}

	ctx := context.Background()
	get(ctx, "/items")
	get(transport.WithOverride(ctx, transport.Override{Attempts: 1}), "/items")
	get(transport.WithOverride(ctx, transport.Override{NoRetry: true}), "/items")
	get(transport.WithOverride(ctx, transport.Override{Attempts: 10}), "/items") // the set's 3
	get(transport.WithOverride(ctx, transport.Override{Attempts: 2, PerAttempt: 10 * time.Millisecond}), "/slow")
	// Output:
	// 503 Service Unavailable (wire attempts: 3)
	// 503 Service Unavailable (wire attempts: 1)
	// 503 Service Unavailable (wire attempts: 1)
	// 503 Service Unavailable (wire attempts: 3)
	// Get "http://inventory.internal/slow": resilix: 2 attempts: attempt timed out: no response headers after 10ms
}

// Retry.If says which attempts are retried, apart from Set.Classify, which
// says what counts against the upstream's health. Here a 409 Conflict,
// which may well succeed a moment later, is retried, while Classify still
// calls it a success: the breaker learns of no failure. The idempotency
// rules still apply on top: a plain POST is sent once.
func ExampleNew_retryIf() {
	var gets atomic.Int32
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && gets.Add(1) > 2 {
			fmt.Fprint(w, "ok")
			return
		}
		w.WriteHeader(http.StatusConflict)
	}))
	rt, err := transport.New(transport.Config{
		Base: upstream,
		Policies: policy.Set{
			Retry: &policy.Retry{
				BaseDelay: time.Millisecond,
				If: func(resp *http.Response, err error) bool {
					return resp != nil && resp.StatusCode == http.StatusConflict ||
						policy.DefaultClassify(resp, err) == policy.Failure
				},
			},
			Breaker: &policy.Breaker{},
		},
		Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				fmt.Printf("attempt %d: %d, a %v for the breaker\n", a.Attempt, a.StatusCode, a.Outcome)
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"item": 7}`)
		}
		req, _ := http.NewRequest(method, "http://orders.internal/orders/42", body)
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(method, "got", resp.Status)
	}
	m := rt.Measured("orders.internal")
	fmt.Println("breaker", m.BreakerState, "with error rate", m.ErrorRate)
	// Output:
	// attempt 1: 409, a success for the breaker
	// attempt 2: 409, a success for the breaker
	// attempt 3: 200, a success for the breaker
	// GET got 200 OK
	// attempt 1: 409, a success for the breaker
	// POST got 409 Conflict
	// breaker closed with error rate 0
}
