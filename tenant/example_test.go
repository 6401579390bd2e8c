package tenant_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/tenant"
	"github.com/resilix/resilix/transport"
)

// Three tenants share a dependency; acme makes most of the calls. With 100
// admissions among three active tenants the fair share is 33⅓: acme, at 80,
// is 1.4 fair shares above it, the others below.
func ExampleTracker() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tr := tenant.NewTracker(0, time.Minute, now)
	for i := range 100 {
		switch {
		case i%10 < 8:
			tr.Add(now, "acme")
		case i%10 == 8:
			tr.Add(now, "globex")
		default:
			tr.Add(now, "initech")
		}
	}
	fmt.Println("active:", tr.Active(now))
	for _, id := range []string{"acme", "globex", "initech", "unknown"} {
		fmt.Printf("%-8s %+.2f\n", id, tr.Excess(now, id))
	}
	// Output:
	// active: 3
	// acme     +1.40
	// globex   -0.70
	// initech  -0.70
	// unknown  -1.00
}

// okWire stands in for the network: a base RoundTripper that runs its func
// and answers 200 OK.
type okWire func(*http.Request)

func (f okWire) RoundTrip(req *http.Request) (*http.Response, error) {
	f(req)
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// A tenant travels in the request's context to every gate, which sheds the
// tenant furthest above its fair share first among calls of one priority.
// Here the dependency takes one call at a time (a limiter pinned at 1, with
// one place in its queue), and acme has made four of the last five calls.
// While acme's fourth call holds the slot, acme and globex call together:
// whichever comes first, acme's call is refused and globex's waits for the
// slot.
func ExampleWith() {
	var wire atomic.Int32
	busy, release := make(chan struct{}), make(chan struct{})
	base := okWire(func(*http.Request) {
		if wire.Add(1) == 5 { // the fifth call holds the slot until released
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
			Refused: func(r policy.Refusal) {
				fmt.Println("the", r.Gate, "refused a call; above its fair share:", r.HeavyTenant)
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}

	call := func(id string) <-chan string {
		done := make(chan string, 1)
		go func() {
			ctx := tenant.With(context.Background(), id)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://reports.internal/", nil)
			resp, err := client.Do(req)
			if err != nil {
				done <- fmt.Sprintf("%s: refused (ErrShed: %v)", id, errors.Is(err, policy.ErrShed))
				return
			}
			resp.Body.Close()
			done <- fmt.Sprintf("%s: %s", id, resp.Status)
		}()
		return done
	}
	for _, id := range []string{"acme", "acme", "acme", "globex"} {
		<-call(id)
	}
	first := call("acme")
	<-busy
	acme, globex := call("acme"), call("globex")
	fmt.Println(<-acme)
	close(release)
	fmt.Println(<-first)
	fmt.Println(<-globex)
	fmt.Println("wire calls:", wire.Load())
	// Output:
	// the limiter refused a call; above its fair share: true
	// acme: refused (ErrShed: true)
	// acme: 200 OK
	// globex: 200 OK
	// wire calls: 6
}
