package hedge

import (
	"math"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// hedgeStep is an instant on a 10s window: the hedges recorded then, and
// the allowance wanted after them.
type hedgeStep struct {
	at            time.Duration
	started, won  int
	wantAllowance float64
}

func TestWinRateAIMDSteps(t *testing.T) {
	h := newState(policy.Hedge{Window: 10 * time.Second,
		WinRate: &policy.WinRate{Floor: 0.5, MinAllowance: 0.1, MinSamples: 4}}, t0)
	for i, s := range []hedgeStep{
		{at: 0, wantAllowance: 1},
		// A window with 8 hedges and 1 win: below the floor, halved.
		{at: 1 * time.Second, started: 8, won: 1, wantAllowance: 1},
		{at: 10 * time.Second, wantAllowance: 0.5},
		{at: 11 * time.Second, started: 8, won: 0, wantAllowance: 0.5},
		{at: 20 * time.Second, wantAllowance: 0.25},
		{at: 21 * time.Second, started: 4, won: 0, wantAllowance: 0.25},
		{at: 30 * time.Second, wantAllowance: 0.125},
		{at: 31 * time.Second, started: 4, won: 0, wantAllowance: 0.125},
		{at: 40 * time.Second, wantAllowance: 0.1}, // the floor, not 0.0625
		// Too few hedges to judge: relaxed by a quarter.
		{at: 41 * time.Second, started: 1, won: 0, wantAllowance: 0.1},
		{at: 50 * time.Second, wantAllowance: 0.35},
		// Hedges that win: a quarter back per window, capped at 1.
		{at: 51 * time.Second, started: 6, won: 5, wantAllowance: 0.35},
		{at: 60 * time.Second, wantAllowance: 0.6},
		{at: 61 * time.Second, started: 6, won: 3, wantAllowance: 0.6}, // exactly the floor: not below it
		{at: 70 * time.Second, wantAllowance: 0.85},
		{at: 80 * time.Second, wantAllowance: 1},
	} {
		now := t0.Add(s.at)
		for range s.started {
			h.Started(now)
		}
		for range s.won {
			h.Won(now)
		}
		if got := h.Allowance(now); math.Abs(got-s.wantAllowance) > 1e-9 {
			t.Fatalf("step %d (at %v): allowance %v, want %v", i, s.at, got, s.wantAllowance)
		}
	}
}

func TestValueIsDeficitAccounted(t *testing.T) {
	h := newState(policy.Hedge{Window: 10 * time.Second,
		WinRate: &policy.WinRate{Floor: 0.5, MinAllowance: 0.25, MinSamples: 1}}, t0)
	for w := range 3 { // three windows of one losing hedge: 1 → 0.5 → 0.25 → 0.25
		h.Started(t0.Add(time.Duration(w) * 10 * time.Second))
		h.Allowance(t0.Add(time.Duration(w+1) * 10 * time.Second))
	}
	now := t0.Add(35 * time.Second) // within the fourth window: no judgment
	if a := h.Allowance(now); a != 0.25 {
		t.Fatalf("allowance %v, want 0.25", a)
	}
	h.credit = 0 // the hedges above were sent without asking the gate
	// At 0.25, credit accumulates a quarter per opportunity: exactly one in
	// four passes, and the spending is spread, not bunched.
	var passed []int
	for i := range 12 {
		if h.worth(now) {
			h.Started(now)
			passed = append(passed, i)
		}
	}
	if len(passed) != 3 || passed[0] != 3 || passed[1] != 7 || passed[2] != 11 {
		t.Fatalf("passed at %v, want every fourth opportunity", passed)
	}
	if !newState(policy.Hedge{}, t0).worth(t0) {
		t.Fatal("without policy.WinRate the value gate always passes")
	}
}

// TestValueIsSpentWhenSent: the value gate spends nothing when it passes;
// Started spends the credit, as the hedge is sent. A hedge that a later
// step refuses (the budget, admission, the body) leaves the credit as it
// was, however often its round asks again, and the next opportunity
// passes as it would have.
func TestValueIsSpentWhenSent(t *testing.T) {
	h := newState(policy.Hedge{Window: 10 * time.Second,
		WinRate: &policy.WinRate{Floor: 0.5, MinAllowance: 0.5, MinSamples: 1}}, t0)
	h.Started(t0)
	now := t0.Add(15 * time.Second) // judged once: 0.5
	if a := h.Allowance(now); a != 0.5 {
		t.Fatalf("allowance %v, want 0.5", a)
	}
	if h.worth(now) {
		t.Fatal("the first opportunity at 0.5 passed: the credit was not 0")
	}
	for i := range 5 {
		if !h.worth(now) {
			t.Fatalf("re-ask %d of a hedge refused after the value gate was refused for value: the pass spent credit", i)
		}
	}
	h.Started(now)
	if h.worth(now) {
		t.Fatal("the opportunity after a hedge was sent passed: Started spent nothing")
	}
	if !h.worth(now) {
		t.Fatal("the second opportunity after a hedge was sent was refused")
	}
	// Two hedges that passed the gate at once are both sent: the second
	// leaves a debt, which the next opportunities pay off.
	h.Started(now)
	h.Started(now)
	var passed int
	for range 6 {
		if h.worth(now) {
			h.Started(now)
			passed++
		}
	}
	if passed != 2 {
		t.Fatalf("%d of 6 opportunities passed after a debt of one hedge, want 2", passed)
	}
}

func TestHealthWithoutABreaker(t *testing.T) {
	h := newState(policy.Hedge{}, t0) // SuppressAt 0.5 of the breaker's 0.5 warm-up trip point: 0.25
	record := func(ok, fail int) {
		for range ok {
			h.Observe(t0, policy.Success)
		}
		for range fail {
			h.Observe(t0, policy.Failure)
		}
		h.Observe(t0, policy.Canceled)  // not evidence
		h.Observe(t0, policy.Discarded) // not evidence
	}
	record(15, 4)
	if r := h.rate(t0); r.Calls != 19 || !h.healthy(t0, nil) {
		t.Fatalf("19 calls (%+v): below MinCalls, a rate is not judged", r)
	}
	record(1, 0)
	if r := h.rate(t0); r.Calls != 20 || r.ErrorRate != 0.2 || !h.healthy(t0, nil) {
		t.Fatalf("20%% errors (%+v): below SuppressAt of the trip point, healthy", r)
	}
	record(0, 2)
	if r := h.rate(t0); h.healthy(t0, nil) {
		t.Fatalf("6 of 22 failed (%+v): past a quarter, hedging suppressed", r)
	}
	if r := h.rate(t0.Add(time.Hour)); r.Calls != 0 || !h.healthy(t0.Add(time.Hour), nil) {
		t.Fatalf("an hour later the window is empty: %+v", r)
	}
}

// TestGateOrder: when several gates would stop a hedge, the first in the
// documented order is the one reported.
func TestGateOrder(t *testing.T) {
	warm := newState(policy.Hedge{MinSamples: 5}, t0)
	for range 5 {
		warm.Record(t0, 10*time.Millisecond, policy.Success)
	}
	sick := newState(policy.Hedge{MinSamples: 5}, t0)
	for range 20 {
		sick.Record(t0, 10*time.Millisecond, policy.Failure)
		sick.Observe(t0, policy.Failure)
	}
	cold := newState(policy.Hedge{}, t0)
	near := t0.Add(time.Millisecond) // closer than the 10ms median
	ok := Due{Live: 1, Wire: 1, Attempts: 3, Priority: shedding.Critical}
	with := func(f func(*Due)) Due { d := ok; f(&d); return d }
	full := func(d *Due) { d.Live = 3 } // the default MaxConcurrent
	bulk := func(d *Due) { d.Priority = shedding.Bulk }
	for _, tc := range []struct {
		name string
		h    *State
		due  Due
		want policy.SuppressReason
	}{
		{"everything passes", warm, ok, 0},
		{"cold, and everything else", cold, with(func(d *Due) { d.Deadline = near; full(d); bulk(d) }), policy.HedgeWarming},
		{"deadline before concurrency", warm, with(func(d *Due) { d.Deadline = near; full(d) }), policy.HedgeDeadline},
		{"attempts spent before priority", warm, with(func(d *Due) { d.Wire = 3; bulk(d) }), policy.HedgeConcurrency},
		{"legs in flight before priority", warm, with(func(d *Due) { full(d); bulk(d) }), policy.HedgeConcurrency},
		{"priority before health", sick, with(bulk), policy.HedgePriority},
		{"health", sick, ok, policy.HedgeHealth},
	} {
		if got := tc.h.Gate(t0, tc.due); got != tc.want {
			t.Errorf("%s: Gate = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestFastFailuresKeepTheThreshold: a scope at 200 calls a second, calm at
// 4ms, then failing every call in 0.2ms for 4s. Failures never pull the
// threshold below the calm's (they are recorded as failures); the same
// latencies as successes would have pulled it down to theirs.
func TestFastFailuresKeepTheThreshold(t *testing.T) {
	for _, o := range []policy.Outcome{policy.Failure, policy.Success} {
		h := newState(policy.Hedge{}, t0)
		at := func(i int) time.Time { return t0.Add(time.Duration(i) * 5 * time.Millisecond) }
		for i := range 4000 { // 20s
			h.Record(at(i), 4*time.Millisecond, policy.Success)
			h.Threshold(at(i))
		}
		calm, _ := h.Threshold(at(3999))
		low := calm
		for i := 4000; i < 4800; i++ { // 4s
			h.Record(at(i), 200*time.Microsecond, o)
			low = min(low, first(h.Threshold(at(i))))
		}
		switch {
		case o == policy.Failure && low != calm:
			t.Errorf("fast failures: threshold down to %v, want the calm's %v", low, calm)
		case o == policy.Success && low >= calm:
			t.Errorf("fast successes: threshold %v, want it below the calm's %v", low, calm)
		}
	}
}

func first(d time.Duration, _ bool) time.Duration { return d }
