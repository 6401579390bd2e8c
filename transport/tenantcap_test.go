package transport

import (
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// TestALongTenantIsNotPropagated: a 1 MiB tenant id, in the request's
// header or in its context, is not written on the wire by a key with
// Propagate on: it is dropped, counted as a malformed header and reported
// with at most 64 bytes of it, and the call allocates kilobytes, not the
// id's megabyte again and again; an id of MaxTenantLen bytes goes as it
// is.
func TestALongTenantIsNotPropagated(t *testing.T) {
	huge := strings.Repeat("t", 1<<20)
	for _, where := range []string{"header", "context"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				var sent atomic.Int64 // the length of the last tenant header the server saw
				f.net.Listen("api:80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					sent.Store(int64(len(r.Header.Get("Resilix-Tenant"))))
				}))
				var reported atomic.Int64
				rt := newLaneTransport(t, f, Config{
					Policies: policy.Set{Propagate: true},
					Observer: &policy.Observer{MalformedHeader: func(m policy.MalformedHeader) {
						if m.Header == "Resilix-Tenant" && len(m.Value) <= 64 {
							reported.Add(1)
						}
					}},
				})
				call := func(id string) {
					t.Helper()
					req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
					if where == "header" {
						req.Header.Set("Resilix-Tenant", id)
					} else {
						req = req.WithContext(tenant.With(req.Context(), id))
					}
					resp, err := rt.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				call(strings.Repeat("t", MaxTenantLen))
				if n := sent.Load(); n != MaxTenantLen {
					t.Errorf("an id of MaxTenantLen bytes: %d bytes sent", n)
				}
				const calls = 20
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for range calls {
					call(huge)
				}
				runtime.ReadMemStats(&after)
				if n := sent.Load(); n != 0 {
					t.Errorf("a 1 MiB id: %d bytes sent", n)
				}
				if n := reported.Load(); n != calls {
					t.Errorf("%d reported; want %d", n, calls)
				}
				if m := rt.Measured("api"); m.MalformedHeaders != calls {
					t.Errorf("%d malformed headers counted; want %d", m.MalformedHeaders, calls)
				}
				per := (after.TotalAlloc - before.TotalAlloc) / calls
				t.Logf("%d bytes allocated a call", per)
				if per > 64<<10 {
					t.Errorf("%d bytes allocated a call; want at most 64 KiB", per)
				}
			})
		})
	}
}

// TestDistrustHeaders: with DistrustHeaders, a request's own priority and
// tenant headers (an outsider's, copied by a proxy) name nothing: the call
// is Critical with no tenant, and with Propagate on they are not sent on;
// the context's still are. Without it, the headers name the call's.
func TestDistrustHeaders(t *testing.T) {
	for _, distrust := range []bool{false, true} {
		var prio atomic.Value // the last call's priority
		var wire atomic.Value // the last attempt's headers
		rt := mustNew(t, Config{
			Base: fakeRT(func(r *http.Request) (*http.Response, error) {
				wire.Store(r.Header.Clone())
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			}),
			Policies:        policy.Set{Propagate: true},
			DistrustHeaders: distrust,
			Observer:        &policy.Observer{CallDone: func(c policy.CallInfo) { prio.Store(c.Priority) }},
		})
		call := func(req *http.Request) (shedding.Priority, http.Header) {
			t.Helper()
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return prio.Load().(shedding.Priority), wire.Load().(http.Header)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
		req.Header.Set("Resilix-Priority", "bulk")
		req.Header.Set("Resilix-Tenant", "mallory")
		p, h := call(req)
		wantPrio, wantP, wantT := shedding.Bulk, "bulk", "mallory"
		if distrust {
			wantPrio, wantP, wantT = shedding.Critical, "", ""
		}
		if p != wantPrio || h.Get("Resilix-Priority") != wantP || h.Get("Resilix-Tenant") != wantT {
			t.Errorf("distrust %v, the headers' call: %v, sent priority %q, tenant %q; want %v, %q, %q",
				distrust, p, h.Get("Resilix-Priority"), h.Get("Resilix-Tenant"), wantPrio, wantP, wantT)
		}
		ctx := tenant.With(shedding.WithPriority(req.Context(), shedding.Degraded), "acme")
		p, h = call(req.WithContext(ctx))
		if p != shedding.Degraded || h.Get("Resilix-Priority") != "degraded" || h.Get("Resilix-Tenant") != "acme" {
			t.Errorf("distrust %v, the context's call: %v, sent priority %q, tenant %q; want the context's",
				distrust, p, h.Get("Resilix-Priority"), h.Get("Resilix-Tenant"))
		}
	}
}
