package transport_test

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// An incident: payments.internal is sending wrong answers, so an operator
// takes it out of rotation. Its callers get a refusal they already handle
// for an open breaker, no request reaches it, and Release puts it back
// once it is fixed. The upstream here is in memory.
func ExampleTransport_Isolate() {
	upstream := httptestutil.NewUpstream(httptestutil.Options{})
	rt, err := transport.New(transport.Config{
		Base:     upstream.RoundTripper(),
		Policies: policy.Set{Breaker: &policy.Breaker{}},
		Observer: &policy.Observer{
			BreakerTransition: func(bt policy.BreakerTransition) {
				fmt.Printf("%s: %v → %v\n", bt.Key, bt.From, bt.To)
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}

	if err := rt.Isolate("payments.internal"); err != nil {
		fmt.Println(err)
		return
	}
	_, err = client.Get("https://payments.internal/charge")
	fmt.Println("circuit open:", errors.Is(err, policy.ErrCircuitOpen), "isolated:", errors.Is(err, policy.ErrIsolated))
	fmt.Println("state:", rt.Measured("payments.internal").BreakerState, "requests sent:", upstream.Stats().Requests)

	if err := rt.Release("payments.internal"); err != nil {
		fmt.Println(err)
		return
	}
	resp, err := client.Get("https://payments.internal/charge")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status, "requests sent:", upstream.Stats().Requests)
	// Output:
	// payments.internal: closed → isolated
	// circuit open: true isolated: true
	// state: isolated requests sent: 0
	// payments.internal: isolated → closed
	// 200 OK requests sent: 1
}
