package transport_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// fakeWire stands in for the network in these examples: a base
// RoundTripper that answers every request with the status its func
// returns. Counting its calls counts what reached the wire.
type fakeWire func(*http.Request) int

func (f fakeWire) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close() // a RoundTripper closes the request's body
	}
	code := f(req)
	return &http.Response{
		StatusCode: code,
		Status:     fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Header:     http.Header{},
		Body:       http.NoBody,
		Request:    req,
	}, nil
}

// plural returns "1 wire call" or "n wire calls".
func plural(n int) string {
	if n == 1 {
		return "1 wire call"
	}
	return fmt.Sprintf("%d wire calls", n)
}

// PerKey gives one host its own policies. Both hosts here fail twice, then
// recover; only payments.internal retries, so only it gets the 200, for
// two more wire calls, while search.internal keeps the default set (no
// retry) and sends each call once.
func ExampleConfig_perKey() {
	var mu sync.Mutex
	wire := map[string]int{} // wire calls per host
	base := fakeWire(func(req *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		wire[req.URL.Host]++
		if wire[req.URL.Host] <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})

	rt, err := transport.New(transport.Config{
		Base:     base,
		Policies: policy.Set{}, // every other host: no policy
		PerKey: map[string]policy.Set{
			"payments.internal": {Retry: &policy.Retry{BaseDelay: time.Millisecond}},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	for _, host := range []string{"payments.internal", "search.internal"} {
		resp, err := client.Get("http://" + host + "/")
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		mu.Lock()
		fmt.Printf("%s: %s after %s\n", host, resp.Status, plural(wire[host]))
		mu.Unlock()
	}
	// Output:
	// payments.internal: 200 OK after 3 wire calls
	// search.internal: 503 Service Unavailable after 1 wire call
}

// Key decides which requests share state. Here every host under
// payments.internal shares one key, so one breaker: when eu.payments.internal
// fails three times in a row the breaker opens, and a call to
// us.payments.internal is refused without reaching the wire.
// search.internal has a key, and a breaker, of its own, and is untouched.
func ExampleConfig_key() {
	var mu sync.Mutex
	wire := map[string]int{} // wire calls per host
	base := fakeWire(func(req *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		wire[req.URL.Host]++
		if req.URL.Host == "eu.payments.internal" {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})

	rt, err := transport.New(transport.Config{
		Base: base,
		Key: func(req *http.Request) string {
			if strings.HasSuffix(req.URL.Hostname(), ".payments.internal") {
				return "payments.internal"
			}
			return req.URL.Hostname()
		},
		Policies: policy.Set{Breaker: &policy.Breaker{ConsecutiveFailures: 3}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	get := func(host string) {
		resp, err := client.Get("http://" + host + "/")
		var rej *policy.RejectedError
		switch {
		case errors.As(err, &rej) && errors.Is(err, policy.ErrCircuitOpen):
			fmt.Printf("%s: refused, the breaker of %s is open\n", host, rej.Key)
			return
		case err != nil:
			fmt.Printf("%s: %v\n", host, err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%s: %s\n", host, resp.Status)
	}
	for range 3 {
		get("eu.payments.internal")
	}
	get("us.payments.internal")
	get("search.internal")

	for _, key := range []string{"payments.internal", "search.internal"} {
		fmt.Printf("key %s: breaker %v\n", key, rt.Measured(key).BreakerState)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, host := range []string{"eu.payments.internal", "us.payments.internal", "search.internal"} {
		fmt.Printf("%s: %s\n", host, plural(wire[host]))
	}
	// Output:
	// eu.payments.internal: 503 Service Unavailable
	// eu.payments.internal: 503 Service Unavailable
	// eu.payments.internal: 503 Service Unavailable
	// us.payments.internal: refused, the breaker of payments.internal is open
	// search.internal: 200 OK
	// key payments.internal: breaker open
	// key search.internal: breaker closed
	// eu.payments.internal: 3 wire calls
	// us.payments.internal: 0 wire calls
	// search.internal: 1 wire call
}

// A POST is not retried unless it is safe to send twice: when it carries
// an Idempotency-Key header, or its context went through MarkRepeatable.
// Each POST here meets a 503 on its first wire call and a 200 on the next.
func ExampleMarkRepeatable() {
	var wire int // wire calls of the current POST; the calls are sequential
	base := fakeWire(func(*http.Request) int {
		wire++
		if wire == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	rt, err := transport.New(transport.Config{
		Base:     base,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}

	post := func(what string, ctx context.Context, header http.Header) {
		wire = 0
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			"http://orders.internal/orders", strings.NewReader(`{"item":42}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%-24s %s after %s\n", what+":", resp.Status, plural(wire))
	}
	ctx := context.Background()
	post("plain POST", ctx, nil)
	post("with Idempotency-Key", ctx, http.Header{"Idempotency-Key": {"order-7f3a"}})
	post("marked repeatable", transport.MarkRepeatable(ctx), nil)
	// Output:
	// plain POST:              503 Service Unavailable after 1 wire call
	// with Idempotency-Key:    200 OK after 2 wire calls
	// marked repeatable:       200 OK after 2 wire calls
}

// An Observer hears what resilix did to each call. Each call here meets a
// 503 on its first wire call and a 200 on the next: the GET is retried,
// the plain POST is not, and the Observer is told why.
func ExampleConfig_observer() {
	var wire int // wire calls of the current call; the calls are sequential
	base := fakeWire(func(*http.Request) int {
		wire++
		if wire == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	rt, err := transport.New(transport.Config{
		Base:     base,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
		Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				fmt.Printf("  attempt %d (%v): %d %v\n", a.Attempt, a.Kind, a.StatusCode, a.Outcome)
			},
			RetrySkipped: func(s policy.RetrySkip) {
				fmt.Printf("  not retried: %v\n", s.Reason)
			},
			CallDone: func(c policy.CallInfo) {
				fmt.Printf("  call: %d %v after %s\n", c.StatusCode, c.Outcome, plural(c.WireAttempts))
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		wire = 0
		fmt.Println(method)
		req, err := http.NewRequest(method, "http://orders.internal/orders", nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	// Output:
	// GET
	//   attempt 1 (first): 503 failure
	//   attempt 2 (retry): 200 success
	//   call: 200 success after 2 wire calls
	// POST
	//   attempt 1 (first): 503 failure
	//   not retried: not_replayable
	//   call: 503 failure after 1 wire call
}
