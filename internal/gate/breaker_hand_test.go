package gate

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// The moves an operator makes (Isolate, Release, Reset).
var (
	bkIsolateClosed = BreakerChange{policy.BreakerClosed, policy.BreakerIsolated}
	bkIsolateOpen   = BreakerChange{policy.BreakerOpen, policy.BreakerIsolated}
	bkIsolateHalf   = BreakerChange{policy.BreakerHalfOpen, policy.BreakerIsolated}
	bkReleased      = BreakerChange{policy.BreakerIsolated, policy.BreakerClosed}
	bkResetOpen     = BreakerChange{policy.BreakerOpen, policy.BreakerClosed}
	bkResetHalf     = BreakerChange{policy.BreakerHalfOpen, policy.BreakerClosed}
)

// TestBreakerIsolate: an isolated breaker refuses everything, with Isolated
// and no RetryAfter, for as long as it is not released, whatever time
// passes and whatever its rules would say; a call admitted before the
// isolation finishes and counts for nothing; Release closes it with a
// fresh run.
func TestBreakerIsolate(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 3, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 1}
	none := [2]time.Duration{0, 0}
	b, _ := bkRun(t, cfg, []bkStep{
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 1 * bkS, op: bkCall, o: policy.Failure, ok: true}, // a run of two
		{at: 1 * bkS, op: bkAllow, slot: 0, ok: true},          // in flight across the isolation
		{at: 2 * bkS, op: bkIsolate, ok: true, change: bkIsolateClosed, state: policy.BreakerIsolated},
		{at: 2 * bkS, op: bkIsolate, ok: true, state: policy.BreakerIsolated}, // again: no change
		{at: 2 * bkS, op: bkAllow, slot: 1, iso: true, retry: none, state: policy.BreakerIsolated},
		// The call in flight finishes; its failure would have tripped the
		// breaker, and counts for nothing.
		{at: 3 * bkS, op: bkDone, slot: 0, o: policy.Failure, ok: true, state: policy.BreakerIsolated},
		// Neither time nor Reset ends an isolation.
		{at: time.Hour, op: bkCheck, state: policy.BreakerIsolated},
		{at: time.Hour, op: bkReset, ok: true, state: policy.BreakerIsolated},
		{at: time.Hour, op: bkCall, o: policy.Success, iso: true, retry: none, state: policy.BreakerIsolated},
		{at: time.Hour, op: bkRelease, ok: true, change: bkReleased},
		{at: time.Hour, op: bkRelease, ok: true}, // not isolated: no change
		// Closed with a fresh run: the two failures before are gone.
		{at: time.Hour + 1*bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: time.Hour + 2*bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: time.Hour + 3*bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
	})
	if b.Isolated() {
		t.Fatal("Isolated after Release")
	}
	if r := b.Rate(bkStart.Add(time.Hour + 3*bkS)); r.Calls != 3 {
		t.Fatalf("Rate after the trip = %+v, want the 3 calls since the release", r)
	}
}

// TestBreakerIsolateOpenAndHalfOpen: an open or half-open breaker is
// isolated from where it is, its probe in flight counts for nothing, and
// Release closes it, whatever it was before.
func TestBreakerIsolateOpenAndHalfOpen(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 1, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 1}
	none := [2]time.Duration{0, 0}
	bkRun(t, cfg, []bkStep{
		{at: 0, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 1 * bkS, op: bkIsolate, ok: true, change: bkIsolateOpen, state: policy.BreakerIsolated},
		{at: 10 * bkS, op: bkAllow, iso: true, retry: none, state: policy.BreakerIsolated}, // the opening ran out: still isolated
		{at: 10 * bkS, op: bkRelease, ok: true, change: bkReleased},
		{at: 11 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 16 * bkS, op: bkAllow, slot: 0, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 16 * bkS, op: bkIsolate, ok: true, change: bkIsolateHalf, state: policy.BreakerIsolated},
		// The probe's success is of the last generation: it closes nothing.
		{at: 17 * bkS, op: bkDone, slot: 0, o: policy.Success, ok: true, state: policy.BreakerIsolated},
		{at: 18 * bkS, op: bkRelease, ok: true, change: bkReleased},
		{at: 18 * bkS, op: bkCall, o: policy.Success, ok: true},
	})
}

// TestBreakerReset: Reset closes an open breaker at once, and a half-open
// one (its probe in flight counts for nothing), with an empty window; it
// leaves a closed breaker and its window as they are. An opening that has
// run out, not yet moved to half-open, is closed from open.
func TestBreakerReset(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 2, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 1}
	b, _ := bkRun(t, cfg, []bkStep{
		{at: 0, op: bkCall, o: policy.Success, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkReset, ok: true}, // closed: nothing to do, the run is kept
		{at: 1 * bkS, op: bkAllow, slot: 0, ok: true},
		{at: 1 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 2 * bkS, op: bkReset, ok: true, change: bkResetOpen},
		// A permit from before the trip is two generations old.
		{at: 2 * bkS, op: bkDone, slot: 0, o: policy.Failure, ok: true},
		{at: 2 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 3 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 8 * bkS, op: bkAllow, slot: 1, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 8 * bkS, op: bkReset, ok: true, change: bkResetHalf},
		{at: 9 * bkS, op: bkDone, slot: 1, o: policy.Failure, ok: true}, // the probe: ignored
		{at: 9 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 10 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 20 * bkS, op: bkCheck, state: policy.BreakerHalfOpen}, // run out, not moved
		{at: 20 * bkS, op: bkReset, ok: true, change: bkResetOpen},
		{at: 20 * bkS, op: bkCall, o: policy.Success, ok: true},
	})
	if r := b.Rate(bkStart.Add(20 * bkS)); r.Calls != 1 || r.Failures != 0 {
		t.Fatalf("Rate = %+v, want the one call since the reset", r)
	}
}

// TestBreakerHandKeepsTheBaseline: Isolate, Release and Reset keep what the
// breaker learned of the dependency's normal failure rate, and empty the
// window.
func TestBreakerHandKeepsTheBaseline(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: -1}
	steps := bkTraffic(0, 100*time.Millisecond, 400, bkPct12, false) // 12% for 40s
	b, _ := bkRun(t, cfg, steps)
	now := bkStart.Add(40 * bkS)
	learned := b.Rate(now)
	if !learned.BaselineKnown || learned.Baseline == 0 || learned.Calls == 0 {
		t.Fatalf("Rate after 40s at 12%% = %+v, want a baseline and a window", learned)
	}
	want := BreakerRate{TripPoint: learned.TripPoint, Baseline: learned.Baseline, BaselineKnown: true, MinCalls: learned.MinCalls}
	for _, moves := range [][]func(time.Time) BreakerChange{
		{b.Isolate, b.Release},
		{b.Reset}, // closed: the window is kept, so the trip first
	} {
		if len(moves) == 1 {
			for b.State(now) == policy.BreakerClosed {
				p, _ := b.Allow(now)
				b.Done(now, p, policy.Failure)
			}
		}
		for _, move := range moves {
			if !move(now).Changed() {
				t.Fatal("a move changed nothing")
			}
		}
		if got := b.Rate(now); !cmp.Equal(got, want) {
			t.Fatalf("Rate after the moves (-want +got):\n%s", cmp.Diff(want, got))
		}
	}
}

// TestManualBreaker: a key's breaker without a Breaker configured admits
// everything and learns nothing, until it is isolated.
func TestManualBreaker(t *testing.T) {
	none := [2]time.Duration{0, 0}
	b, _ := bkRunOn(t, NewManualBreaker(), []bkStep{
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkCall, o: policy.Failure, ok: true},
		{at: 0, op: bkAllow, slot: 0, ok: true},
		{at: 0, op: bkReset, ok: true},
		{at: 1 * bkS, op: bkIsolate, ok: true, change: bkIsolateClosed, state: policy.BreakerIsolated},
		{at: 1 * bkS, op: bkDone, slot: 0, o: policy.Failure, ok: true, state: policy.BreakerIsolated},
		{at: 2 * bkS, op: bkCall, o: policy.Success, iso: true, retry: none, state: policy.BreakerIsolated},
		{at: time.Hour, op: bkRelease, ok: true, change: bkReleased},
		{at: time.Hour, op: bkCall, o: policy.Failure, ok: true},
	})
	if r := b.Rate(bkStart.Add(time.Hour)); r != (BreakerRate{}) {
		t.Fatalf("Rate = %+v, want the zero BreakerRate", r)
	}
	var nb *Breaker
	if nb.Isolate(bkStart).Changed() || nb.Release(bkStart).Changed() || nb.Reset(bkStart).Changed() {
		t.Fatal("a nil breaker moved")
	}
}

// TestBreakerHandAllocs: the moves allocate only the fresh window of a
// close, and Allow on an isolated breaker nothing.
func TestBreakerHandAllocs(t *testing.T) {
	b := newBreaker(policy.Breaker{}, bkStart, 1)
	if n := testing.AllocsPerRun(100, func() {
		b.Isolate(bkStart)
		b.Allow(bkStart)
	}); n != 0 {
		t.Fatalf("Isolate and a refused Allow: %v allocs, want 0", n)
	}
	m := NewManualBreaker()
	if n := testing.AllocsPerRun(100, func() {
		m.Isolate(bkStart)
		m.Release(bkStart)
		p, _ := m.Allow(bkStart)
		m.Done(bkStart, p, policy.Failure)
	}); n != 0 {
		t.Fatalf("a manual breaker's moves: %v allocs, want 0", n)
	}
}
