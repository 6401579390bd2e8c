package gate

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestTenantsAllocatedByTheFirstNamedTenant: calls that name no tenant
// never allocate the scope's tracker; the first that names one does, and
// the throttler and the limiter then record in that one tracker.
func TestTenantsAllocatedByTheFirstNamedTenant(t *testing.T) {
	tenants := new(Tenants)
	th := NewThrottler(policy.Throttler{}.WithDefaults(), thStart, 1, tenants)
	l := NewLimiter(policy.Limiter{}.WithDefaults(), thStart, tenants)
	ctx := context.Background()
	for range 10 {
		if d := th.Admit(thStart, shedding.Critical, ""); !d.OK {
			t.Fatal("throttler refused with no pressure")
		}
		p, d := l.Acquire(ctx, thStart, shedding.Critical, "")
		if !d.OK {
			t.Fatal("limiter refused below its limit")
		}
		l.Release(p, thStart, time.Millisecond, policy.Success)
	}
	if tenants.t.Load() != nil {
		t.Fatal("calls with no tenant allocated the tracker")
	}
	th.Admit(thStart, shedding.Critical, "acme")
	tr := tenants.t.Load()
	if tr == nil {
		t.Fatal("a call naming a tenant did not allocate the tracker")
	}
	p, _ := l.Acquire(ctx, thStart, shedding.Critical, "acme")
	l.Release(p, thStart, time.Millisecond, policy.Success)
	if tenants.t.Load() != tr {
		t.Fatal("the limiter allocated a tracker of its own")
	}
	if got := tr.Total(thStart); got != 2 {
		t.Errorf("shared tracker total %d, want 2 (one admission by each gate)", got)
	}
}

// TestTenantsConcurrentFirstCallsShareOne: first calls racing all get the
// same tracker.
func TestTenantsConcurrentFirstCallsShareOne(t *testing.T) {
	tenants := new(Tenants)
	var wg sync.WaitGroup
	got := make([]any, 8)
	for i := range got {
		wg.Go(func() { got[i] = tenants.tracker(thStart) })
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] || got[i] == nil {
			t.Fatalf("call %d got tracker %p, call 0 got %p", i, got[i], got[0])
		}
	}
}
