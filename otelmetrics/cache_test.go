package otelmetrics

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

func TestCacheBound(t *testing.T) {
	var c cache
	first := c.get("k0")
	if c.get("k0") != first {
		t.Fatal("a cached key got a new entry")
	}
	for i := 1; i < maxCachedKeys; i++ {
		c.get("k" + strconv.Itoa(i))
	}
	if c.n != maxCachedKeys || c.get("k0") != first {
		t.Fatalf("at the bound: %d keys held, k0 kept %v", c.n, c.get("k0") == first)
	}
	// One more key empties the cache and starts again.
	c.get("new")
	if c.n != 1 {
		t.Fatalf("past the bound: %d keys held, want 1", c.n)
	}
	if c.get("k0") == first {
		t.Fatal("k0 survived the reset")
	}
}

func TestEntrySlots(t *testing.T) {
	e := newEntry("k")
	if a, b := e.outcome(policy.Success), e.outcome(policy.Success); a != b {
		t.Error("outcome attrs not reused")
	}
	if e.outcome(policy.Success) == e.outcome(policy.Failure) {
		t.Error("two outcomes share attrs")
	}
	if a, b := e.attempt(policy.AttemptHedge, policy.Discarded), e.attempt(policy.AttemptHedge, policy.Discarded); a != b {
		t.Error("attempt attrs not reused")
	}
	// The last outcome this version knows has its slots too.
	if a, b := e.outcome(policy.Invalid), e.outcome(policy.Invalid); a != b {
		t.Error("the invalid outcome's attrs not reused")
	}
	if a, b := e.attempt(policy.AttemptFirst, policy.Invalid), e.attempt(policy.AttemptFirst, policy.Invalid); a != b {
		t.Error("the invalid attempt's attrs not reused")
	}
	if a, b := e.suppressed(policy.HedgeBudget), e.suppressed(policy.HedgeBudget); a != b {
		t.Error("suppression attrs not reused")
	}
	if a, b := e.skipped(policy.SkipBudget, 0), e.skipped(policy.SkipBudget, 0); a != b {
		t.Error("skip attrs not reused")
	}
	if a, b := e.skipped(policy.SkipGate, policy.GateBreaker), e.skipped(policy.SkipGate, policy.GateBreaker); a != b {
		t.Error("skip-by-gate attrs not reused")
	}
	if e.skipped(policy.SkipGate, policy.GateBreaker) == e.skipped(policy.SkipGate, policy.GateLimiter) {
		t.Error("two gates share skip attrs")
	}
	// The server's gates (package admission) are cached like the client's.
	for _, g := range []policy.Gate{policy.GateDeadline, policy.GateAdmission} {
		if a, b := refusal(e, g, shedding.Bulk), refusal(e, g, shedding.Bulk); a != b {
			t.Errorf("refusal attrs of gate %v not reused", g)
		}
	}
	for _, why := range []policy.EjectionReason{policy.EjectConsecutive, policy.EjectRate} {
		if a, b := e.ejection(why), e.ejection(why); a != b {
			t.Errorf("ejection attrs of reason %v not reused", why)
		}
	}
	if e.ejection(policy.EjectConsecutive) == e.ejection(policy.EjectRate) {
		t.Error("two ejection reasons share attrs")
	}
	if a, b := e.laneState(laneEjected), e.laneState(laneEjected); a != b || a == e.laneState(laneOpen) {
		t.Error("lane state attrs not reused, or shared by two states")
	}
	// Values this version does not know are built per event, not cached,
	// and carry their String.
	for _, a := range []*attrs{
		e.outcome(policy.Outcome(200)),
		e.attempt(policy.AttemptKind(9), policy.Success),
		e.suppressed(policy.SuppressReason(99)),
		e.skipped(policy.SkipReason(99), 0),
		e.skipped(policy.SkipGate, policy.Gate(42)),
		refusal(e, policy.Gate(42), policy.Refusal{}.Priority),
		refusal(e, policy.GateBreaker, policy.Refusal{Priority: 7}.Priority),
		e.ejection(policy.EjectionReason(99)),
	} {
		if len(a.add) != 1 || len(a.rec) != 1 || len(a.obs) != 1 {
			t.Errorf("attrs %+v", a)
		}
	}
}

// TestCacheDoesNotPinItsKeys: an event's Key may be a substring of a much
// larger string (a request's URL, with a custom transport.Config.Key), and
// an entry that kept it kept the whole string alive.
func TestCacheDoesNotPinItsKeys(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	var c cache
	before := heap()
	for i := range 64 {
		url := "h" + strconv.Itoa(i) + ".test/?q=" + strings.Repeat("q", 1<<20)
		c.get(url[:strings.IndexByte(url, '/')]).outcome(policy.Success)
	}
	retained := heap() - before
	if c.n != 64 {
		t.Fatalf("%d keys cached, want 64", c.n)
	}
	runtime.KeepAlive(&c)
	t.Logf("64 keys retain %d bytes", retained)
	if retained > 8<<20 {
		t.Errorf("64 keys retain %.1f MB, want under 8 MB", float64(retained)/(1<<20))
	}
}
