package gate

import (
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/tenant"
)

// tenantWindow is the history of tenant admissions the throttler and the
// limiter weigh tenants by.
const tenantWindow = 30 * time.Second

// Tenants is the tenant tracker one scope's throttler and limiter share,
// allocated by the first call that names a tenant: a scope whose requests
// name none never pays for one (a tenant.Tracker of default capacity is
// about 13 KB). The zero value is ready to use and holds no tracker; give
// one *Tenants to both gates of a scope. It is safe for concurrent use.
//
// Each gate records its own admissions in the shared tracker, so with both
// on, an attempt both admit is counted twice. That scales every tenant's
// count and the total alike, so a tenant's excess over its fair share,
// which is all the gates read, is the same as each would see alone.
type Tenants struct {
	t atomic.Pointer[tenant.Tracker]
}

// tracker returns the tracker, allocating it with its first generation
// starting at now if no call has yet: call it only for a request that
// names a tenant. Concurrent first calls allocate one each, and all but
// one are dropped, so every caller gets the same tracker.
func (s *Tenants) tracker(now time.Time) *tenant.Tracker {
	if t := s.t.Load(); t != nil {
		return t
	}
	t := tenant.NewTracker(0, tenantWindow, now)
	if s.t.CompareAndSwap(nil, t) {
		return t
	}
	return s.t.Load()
}
