package admission_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
	"github.com/resilix/resilix/transport"
)

// backSaw is what the back tier's handler found: its context's values,
// and the four headers as they came over the wire.
type backSaw struct {
	prio      shedding.Priority
	hasPrio   bool
	tenant    string
	hasTenant bool
	attempt   int
	left      time.Duration // until the context's deadline; -1: none
	headers   map[string][]string
}

// TestAnUntrustedCallerCannotSpeakThroughATrustedHop runs three tiers
// over loopback: an outside caller, a front service (admission trusting
// nobody, an httputil.ReverseProxy over a resilix transport), and a back
// service whose admission trusts the front. Whatever the outside caller
// writes in the four headers, the back tier gets only what the front
// decided: the front's priority (its DefaultPriority), no tenant, the
// front's own deadline and attempt number. Over a key with Propagate the
// transport writes them; over a key without it nothing is added, and the
// caller's priority and tenant, which the front did not trust, are gone
// all the same, while its well-formed timeout and attempt number, which
// admission honours from anyone, pass as they came.
func TestAnUntrustedCallerCannotSpeakThroughATrustedHop(t *testing.T) {
	var mu sync.Mutex
	var saw []backSaw
	back, err := admission.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		s := backSaw{left: -1, headers: map[string][]string{}}
		s.prio, s.hasPrio = shedding.PriorityFrom(ctx)
		s.tenant, s.hasTenant = tenant.From(ctx)
		s.attempt, _ = attempt.From(ctx)
		if dl, ok := ctx.Deadline(); ok {
			s.left = time.Until(dl)
		}
		for _, k := range []string{"Resilix-Priority", "Resilix-Tenant", "Resilix-Timeout-Ms", "Resilix-Attempt"} {
			if vs := r.Header[k]; vs != nil {
				s.headers[k] = vs
			}
		}
		mu.Lock()
		saw = append(saw, s)
		mu.Unlock()
	}), admission.Config{
		Trust:           func(*http.Request) bool { return true }, // only the front reaches it
		DefaultPriority: shedding.Degraded,
	})
	if err != nil {
		t.Fatal(err)
	}
	backSrv := httptest.NewServer(back)
	defer backSrv.Close()
	backURL, _ := url.Parse(backSrv.URL)

	for _, propagate := range []bool{true, false} {
		t.Run("Propagate "+strconv.FormatBool(propagate), func(t *testing.T) {
			rt, err := transport.New(transport.Config{Policies: policy.Set{Propagate: propagate}})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.CloseIdleConnections()
			proxy := &httputil.ReverseProxy{
				Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(backURL) },
				Transport: rt,
			}
			front, err := admission.Handler(proxy, admission.Config{DefaultPriority: shedding.Bulk})
			if err != nil {
				t.Fatal(err)
			}
			frontSrv := httptest.NewServer(front)
			defer frontSrv.Close()

			for _, tc := range []struct {
				name string
				sent map[string]string   // by the outside caller
				prio shedding.Priority   // in the back's context
				left time.Duration       // at most, in the back's context; -1: no deadline
				wire map[string][]string // on the back's request with Propagate, but the timeout
			}{
				{
					name: "all four",
					sent: map[string]string{"Resilix-Priority": "critical", "Resilix-Tenant": "evil",
						"Resilix-Timeout-Ms": "60000", "Resilix-Attempt": "1"},
					prio: shedding.Bulk, left: time.Minute,
					wire: map[string][]string{"Resilix-Priority": {"bulk"}, "Resilix-Attempt": {"1"}},
				},
				{
					name: "a repeat",
					sent: map[string]string{"Resilix-Tenant": "evil", "Resilix-Attempt": "3"},
					prio: shedding.Bulk, left: -1,
					wire: map[string][]string{"Resilix-Priority": {"bulk"}, "Resilix-Attempt": {"1"}},
				},
				{
					name: "malformed timeout and attempt",
					sent: map[string]string{"Resilix-Tenant": "", "Resilix-Timeout-Ms": "soon", "Resilix-Attempt": "first"},
					prio: shedding.Bulk, left: -1,
					wire: map[string][]string{"Resilix-Priority": {"bulk"}, "Resilix-Attempt": {"1"}},
				},
			} {
				mu.Lock()
				saw = nil
				mu.Unlock()
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, frontSrv.URL+"/", nil)
				for k, v := range tc.sent {
					req.Header.Set(k, v)
				}
				resp, err := frontSrv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: the front answered %d", tc.name, resp.StatusCode)
				}
				mu.Lock()
				got := saw
				mu.Unlock()
				if len(got) != 1 {
					t.Fatalf("%s: the back served %d requests, want 1", tc.name, len(got))
				}
				s := got[0]
				want := tc.wire
				wantPrio := tc.prio
				if !propagate {
					// Nothing added: what the caller sent and the front
					// honoured from anyone, as it came.
					want = map[string][]string{}
					for _, k := range []string{"Resilix-Timeout-Ms", "Resilix-Attempt"} {
						if v, ok := tc.sent[k]; ok && v != "soon" && v != "first" {
							want[k] = []string{v}
						}
					}
					wantPrio = shedding.Degraded // the back's default: no priority came
				}
				wire := s.headers
				if to, ok := wire["Resilix-Timeout-Ms"]; ok && propagate && tc.left > 0 {
					ms, err := strconv.Atoi(to[0])
					if len(to) != 1 || err != nil || ms <= 0 || ms > int(tc.left/time.Millisecond) {
						t.Errorf("%s: Resilix-Timeout-Ms %q, want the front's time left, up to %v", tc.name, to, tc.left)
					}
					delete(wire, "Resilix-Timeout-Ms")
				} else if propagate && tc.left > 0 {
					t.Errorf("%s: no Resilix-Timeout-Ms, want the front's time left", tc.name)
				}
				if diff := cmp.Diff(want, wire); diff != "" {
					t.Errorf("%s: the back's headers (-want +got):\n%s", tc.name, diff)
				}
				if s.hasTenant || s.tenant != "" {
					t.Errorf("%s: the back's context holds the tenant %q, want none", tc.name, s.tenant)
				}
				if !s.hasPrio || s.prio != wantPrio {
					t.Errorf("%s: the back's priority %v, want %v", tc.name, s.prio, wantPrio)
				}
				wantAttempt := 1
				if !propagate {
					wantAttempt, _ = strconv.Atoi(tc.sent["Resilix-Attempt"])
				}
				if s.attempt != wantAttempt {
					t.Errorf("%s: the back's attempt %d, want %d", tc.name, s.attempt, wantAttempt)
				}
				switch {
				case tc.left < 0 && s.left >= 0:
					t.Errorf("%s: the back has a deadline %v away, want none", tc.name, s.left)
				case tc.left > 0 && (s.left < 0 || s.left > tc.left):
					t.Errorf("%s: the back's deadline is %v away, want within %v", tc.name, s.left, tc.left)
				}
			}
		})
	}
}
