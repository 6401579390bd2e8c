package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// A dependency answers 503 to everything. Each call carries a Report,
// which says what the status or error alone does not: how many attempts
// were made, why the retries stopped, and which gate refused. The
// upstream here is in memory.
func ExampleWithReport() {
	upstream := httptestutil.NewUpstream(httptestutil.Options{
		Faults: []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
	})
	rt, err := transport.New(transport.Config{
		Base: upstream.RoundTripper(),
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Breaker: &policy.Breaker{ConsecutiveFailures: 5},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}

	for range 3 {
		var rep transport.Report
		req, _ := http.NewRequestWithContext(transport.WithReport(context.Background(), &rep), http.MethodGet, "http://orders.internal/", nil)
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		fmt.Printf("%v, status %d: %d attempts, %d retries", rep.Outcome, rep.StatusCode, rep.WireAttempts, rep.Retries)
		switch {
		case rep.Exhausted:
			fmt.Print(", out of attempts")
		case rep.Skipped != 0:
			fmt.Printf(", retry skipped (%v)", rep.Skipped)
		}
		if rep.Refusal != nil {
			fmt.Printf(", refused by the %v: %v", rep.Gate, rep.Refusal.Err)
		}
		fmt.Println()
	}
	// Output:
	// failure, status 503: 3 attempts, 2 retries, out of attempts
	// failure, status 503: 2 attempts, 1 retries, retry skipped (gate), refused by the breaker: resilix: circuit open
	// rejected, status 0: 0 attempts, 0 retries, refused by the breaker: resilix: circuit open
}
