package transport_test

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// A client that retries a flaky upstream: the first two calls get 503, the
// third succeeds. The upstream here is in memory; in production Base is
// left nil and resilix uses a pooled cleanhttp transport.
func ExampleNew() {
	var calls atomic.Int32
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))

	rt, err := transport.New(transport.Config{
		Base: upstream,
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond},
			Timeout: &policy.Timeout{PerAttempt: time.Second},
		},
		Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				fmt.Printf("attempt %d (%v): %d %v\n", a.Attempt, a.Kind, a.StatusCode, a.Outcome)
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	resp, err := client.Get("http://inventory.internal/items/42")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("caller got", resp.Status)
	// Output:
	// attempt 1 (first): 503 failure
	// attempt 2 (retry): 503 failure
	// attempt 3 (retry): 200 success
	// caller got 200 OK
}

// Invalid configuration is an error from New that names the field.
func ExampleNew_invalid() {
	_, err := transport.New(transport.Config{Policies: policy.Set{
		Hedge: &policy.Hedge{Quantile: 1.5},
	}})
	fmt.Println(err)
	// Output:
	// transport: Policies: policy: Hedge.Quantile must be in (0, 1), got 1.5
}

// A refusal by a gate is an error that names the gate, through http.Client.
func ExampleNew_refusal() {
	rt, _ := transport.New(transport.Config{
		Base:     httptestutil.InMemory(http.NotFoundHandler()),
		Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: 0.001, Burst: 1}},
	})
	client := &http.Client{Transport: rt}
	for range 2 {
		resp, err := client.Get("http://search.internal/")
		var rej *policy.RejectedError
		switch {
		case errors.As(err, &rej):
			fmt.Println("refused by", rej.Gate, "for", rej.Key, "| ErrRateLimited:", errors.Is(err, policy.ErrRateLimited))
		case err != nil:
			fmt.Println(err)
		default:
			resp.Body.Close()
			fmt.Println(resp.Status)
		}
	}
	// Output:
	// 404 Not Found
	// refused by rate_limit for search.internal | ErrRateLimited: true
}

// Measured reads what a key has learned. Each policy has a presence flag:
// a key without a breaker says so, rather than showing a closed one.
func ExampleTransport_Measured() {
	rt, _ := transport.New(transport.Config{
		Base: httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})),
		PerKey: map[string]policy.Set{
			"payments.internal": {Breaker: &policy.Breaker{}},
		},
	})
	client := &http.Client{Transport: rt}
	for _, key := range []string{"payments.internal", "search.internal"} {
		resp, err := client.Get("http://" + key + "/")
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	for _, key := range []string{"payments.internal", "search.internal", "unknown.internal"} {
		m := rt.Measured(key)
		switch {
		case !m.Known:
			fmt.Println(key, "has no state")
		case m.HasBreaker:
			fmt.Println(key, "breaker", m.BreakerState)
		default:
			fmt.Println(key, "has no breaker")
		}
	}
	// Output:
	// payments.internal breaker closed
	// search.internal has no breaker
	// unknown.internal has no state
}
