package shedding_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

// A gate must shed 30% of its traffic. Bulk (20% of the traffic) goes
// first, then half of BestEffort (another 10%); Degraded and Critical are
// untouched.
func ExampleSplit() {
	mix := [shedding.NumPriorities]float64{
		shedding.Critical:   50,
		shedding.Degraded:   10,
		shedding.BestEffort: 20,
		shedding.Bulk:       20,
	}
	p := shedding.Split(0.3, mix)
	for b := shedding.Critical; b < shedding.NumPriorities; b++ {
		fmt.Printf("%-11s %.2f\n", b, p[b])
	}
	// Output:
	// critical    0.00
	// degraded    0.00
	// best_effort 0.50
	// bulk        1.00
}

// okWire stands in for the network: a base RoundTripper that runs its func
// and answers 200 OK.
type okWire func(*http.Request)

func (f okWire) RoundTrip(req *http.Request) (*http.Response, error) {
	f(req)
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// A priority travels in the request's context to every gate. Here the
// dependency takes one call at a time (a limiter pinned at 1, with one place
// in its queue). While a first call holds the slot, a Bulk call and a
// Critical call arrive together: whichever comes first, the Bulk one is
// refused and the Critical one waits for the slot.
func ExampleWithPriority() {
	var wire atomic.Int32
	busy, release := make(chan struct{}), make(chan struct{})
	base := okWire(func(*http.Request) {
		if wire.Add(1) == 1 { // the first call holds the slot until released
			close(busy)
			<-release
		}
	})
	rt, err := transport.New(transport.Config{
		Base: base,
		Policies: policy.Set{
			Limiter: &policy.Limiter{InitialLimit: 1, MinLimit: 1, MaxLimit: 1, QueueFactor: 1},
		},
		Observer: &policy.Observer{
			Refused: func(r policy.Refusal) { fmt.Println("the", r.Gate, "refused a", r.Priority, "call") },
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}

	call := func(p shedding.Priority) <-chan string {
		done := make(chan string, 1)
		go func() {
			ctx := shedding.WithPriority(context.Background(), p)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://reports.internal/", nil)
			resp, err := client.Do(req)
			if err != nil {
				done <- fmt.Sprintf("%v call: refused (ErrShed: %v)", p, errors.Is(err, policy.ErrShed))
				return
			}
			resp.Body.Close()
			done <- fmt.Sprintf("%v call: %s", p, resp.Status)
		}()
		return done
	}
	first := call(shedding.Critical)
	<-busy
	bulk, critical := call(shedding.Bulk), call(shedding.Critical)
	fmt.Println(<-bulk)
	close(release)
	fmt.Println(<-first)
	fmt.Println(<-critical)
	fmt.Println("wire calls:", wire.Load())
	// Output:
	// the limiter refused a bulk call
	// bulk call: refused (ErrShed: true)
	// critical call: 200 OK
	// critical call: 200 OK
	// wire calls: 2
}
