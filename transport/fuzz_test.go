package transport

import (
	"net/http"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// FuzzHeaders sends whatever a caller or a server might put in the headers
// resilix reads, priority and tenant on the request and Retry-After on the
// response, through a chain that uses all three. Nothing may panic, every
// call must end in a response or an error, and a malformed priority is
// counted, never a failed call.
func FuzzHeaders(f *testing.F) {
	for _, seed := range [][3]string{
		{"bulk", "acme", "1"},
		{"CRITICAL ", "", "Sun, 29 Nov 2026 12:00:00 GMT"},
		{"urgent", "\x00\xff", "-1"},
		{"", "a-very-long-tenant-id-that-goes-on-and-on-and-on-and-on-and-on-and-on", "99999999999999999999"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	set := policy.Set{
		Retry:     &policy.Retry{BaseDelay: time.Nanosecond, MaxDelay: time.Nanosecond, MaxRetryAfter: time.Nanosecond},
		Throttler: &policy.Throttler{},
		Limiter:   &policy.Limiter{},
	}
	f.Fuzz(func(t *testing.T, priority, tenantID, retryAfter string) {
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			return respond(r, 503, "Retry-After", retryAfter), nil
		})
		tr := mustNew(t, Config{Base: base, Policies: set})
		req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
		req.Header["Resilix-Priority"] = []string{priority}
		req.Header["Resilix-Tenant"] = []string{tenantID}
		resp, err := tr.RoundTrip(req)
		if (resp == nil) == (err == nil) {
			t.Fatalf("RoundTrip returned %v, %v: exactly one must be set", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	})
}
