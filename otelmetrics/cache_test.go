package otelmetrics

import (
	"strconv"
	"testing"

	"github.com/resilix/resilix/policy"
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
	if a, b := e.suppressed(policy.HedgeBudget), e.suppressed(policy.HedgeBudget); a != b {
		t.Error("suppression attrs not reused")
	}
	// Values this version does not know are built per event, not cached,
	// and carry their String.
	for _, a := range []*attrs{
		e.outcome(policy.Outcome(200)),
		e.attempt(policy.AttemptKind(9), policy.Success),
		e.suppressed(policy.SuppressReason(99)),
		refusal(e, policy.Gate(42), policy.Refusal{}.Priority),
		refusal(e, policy.GateBreaker, policy.Refusal{Priority: 7}.Priority),
	} {
		if len(a.add) != 1 || len(a.rec) != 1 || len(a.obs) != 1 {
			t.Errorf("attrs %+v", a)
		}
	}
}
