package transport_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
	"github.com/resilix/resilix/transport"
)

// resilixHeaders returns the Resilix-* headers of h, sorted, as k=v.
func resilixHeaders(h http.Header) string {
	var kv []string
	for k, vs := range h {
		if strings.HasPrefix(k, "Resilix-") {
			kv = append(kv, k+"="+strings.Join(vs, ","))
		}
	}
	if len(kv) == 0 {
		return "none"
	}
	slices.Sort(kv)
	return strings.Join(kv, " ")
}

// Propagate is on for the internal service only: each of its wire
// attempts, the retry included, carries the call's priority and tenant,
// the time it may take (here the per-attempt timeout, as the call has no
// deadline, less a millisecond for the request's transit) and its own
// number. The third-party API gets none of it.
func ExampleConfig_propagate() {
	var mu sync.Mutex
	calls := 0
	base := fakeWire(func(req *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s: %s\n", req.URL.Host, resilixHeaders(req.Header))
		if calls++; calls == 1 {
			return http.StatusServiceUnavailable // the first attempt fails, and is retried
		}
		return http.StatusOK
	})
	rt, err := transport.New(transport.Config{
		Base: base,
		PerKey: map[string]policy.Set{
			"orders.internal": {
				Propagate: true,
				Retry:     &policy.Retry{BaseDelay: time.Millisecond},
				Timeout:   &policy.Timeout{PerAttempt: 2 * time.Second},
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := tenant.With(shedding.WithPriority(context.Background(), shedding.Degraded), "acme")
	for _, url := range []string{"http://orders.internal/", "https://api.partner.example/"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	// Output:
	// orders.internal: Resilix-Attempt=1 Resilix-Priority=degraded Resilix-Tenant=acme Resilix-Timeout-Ms=1995
	// orders.internal: Resilix-Attempt=2 Resilix-Priority=degraded Resilix-Tenant=acme Resilix-Timeout-Ms=1995
	// api.partner.example: none
}

// A service serving a request that is itself its caller's retry sends its
// own call once, against an upstream that fails, though the key would
// retry it twice: the caller is already repeating the work. Package
// admission puts the number in the context from the Resilix-Attempt
// header; here the context is made by hand.
func Example_attemptRule() {
	var mu sync.Mutex
	wire := 0
	base := fakeWire(func(*http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		wire++
		return http.StatusServiceUnavailable
	})
	rt, err := transport.New(transport.Config{
		Base:     base,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range []int{1, 2} {
		ctx := attempt.With(context.Background(), n) // the request being served arrived as attempt n
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://stock.internal/", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		mu.Lock()
		fmt.Printf("serving attempt %d: %s after %s\n", n, resp.Status, plural(wire))
		wire = 0
		mu.Unlock()
	}
	fmt.Println("calls sent once:", rt.Measured("stock.internal").RepeatsSentOnce)
	// Output:
	// serving attempt 1: 503 Service Unavailable after 3 wire calls
	// serving attempt 2: 503 Service Unavailable after 1 wire call
	// calls sent once: 1
}
