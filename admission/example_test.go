package admission_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/shedding"
)

// A server that trusts the priority of its internal callers (here, by their
// network address; a client certificate from your own CA is another way)
// and gives everyone else BestEffort. next, and any resilix transport it
// calls through, finds the priority and the caller's deadline in its
// context. A request whose caller has no time left never reaches it.
func ExampleHandler() {
	internal := netip.MustParsePrefix("10.0.0.0/8")
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := shedding.PriorityFrom(r.Context())
		deadline, _ := r.Context().Deadline()
		fmt.Fprintf(w, "%v, %v left", p, time.Until(deadline).Round(time.Second))
	})
	h, err := admission.Handler(api, admission.Config{
		Trust: func(r *http.Request) bool {
			ap, err := netip.ParseAddrPort(r.RemoteAddr)
			return err == nil && internal.Contains(ap.Addr().Unmap())
		},
		DefaultPriority: shedding.BestEffort,
	})
	if err != nil {
		panic(err)
	}
	for _, c := range []struct{ from, timeout string }{
		{"10.1.2.3:41000", "30000"},    // internal
		{"203.0.113.9:41000", "30000"}, // outside: cannot say critical
		{"10.1.2.3:41000", "0"},        // no time left
	} {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
		r.RemoteAddr = c.from
		r.Header.Set("Resilix-Priority", "critical")
		r.Header.Set("Resilix-Timeout-Ms", c.timeout)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s: %d %s", c.from, w.Code, w.Body)
		fmt.Println()
	}
	// Output:
	// 10.1.2.3:41000: 200 critical, 30s left
	// 203.0.113.9:41000: 200 best_effort, 30s left
	// 10.1.2.3:41000: 504 resilix: deadline exceeded: the caller's time ran out or is too short to start the request
}
