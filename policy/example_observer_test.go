package policy_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/slogobserver"
	"github.com/resilix/resilix/transport"
)

// An Observer of one's own, joined with package slogobserver's, which logs
// what resilix does (package oteltrace's and otelmetrics' join the same
// way). Each func is optional; this one reacts to a breaker opening, as a
// hook that pages someone might.
func ExampleJoinObservers() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelWarn, // transitions for the worse only
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey { // it varies from run to run
				return slog.Attr{}
			}
			return a
		},
	}))
	page := &policy.Observer{
		BreakerTransition: func(b policy.BreakerTransition) {
			if b.To == policy.BreakerOpen {
				fmt.Printf("page: %s is failing\n", b.Key)
			}
		},
	}

	rt, err := transport.New(transport.Config{
		Base: httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError) // billing is down
		})),
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond},
			Breaker: &policy.Breaker{ConsecutiveFailures: 3},
		},
		Observer: policy.JoinObservers(slogobserver.New(logger, slogobserver.Options{}), page),
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}
	for range 2 { // the first call's three attempts open the breaker
		if resp, err := client.Get("http://billing.internal/invoices"); err == nil {
			resp.Body.Close()
		}
	}
	// Output:
	// level=WARN msg="breaker opened" key=billing.internal from=closed to=open
	// page: billing.internal is failing
}
