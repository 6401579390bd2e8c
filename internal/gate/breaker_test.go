package gate

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// bkStart is the instant every breaker step table starts from.
var bkStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type bkOp uint8

const (
	bkAllow   bkOp = iota + 1 // Allow, keeping the permit in slot
	bkDone                    // Done with the permit in slot and outcome o
	bkCall                    // Allow and, if admitted, Done with o at the same instant
	bkCheck                   // check the state only
	bkIsolate                 // Isolate
	bkRelease                 // Release
	bkReset                   // Reset
)

// bkStep is one step of a breaker table: at bkStart+at, do op, then check
// what it returned and State.
type bkStep struct {
	at   time.Duration
	op   bkOp
	slot int
	o    policy.Outcome

	ok     bool                // bkAllow, bkCall: want admitted
	retry  [2]time.Duration    // refused bkAllow: want RetryAfter in [retry[0], retry[1]]
	iso    bool                // refused bkAllow, bkCall: want Isolated
	change BreakerChange       // want; for bkCall, Done's change, or Allow's when Done made none
	state  policy.BreakerState // want State after the step

	// loose skips every check but the one-permit-per-slot bookkeeping: for
	// generated traffic whose trip instant the table does not pin.
	loose bool
}

// bkChange is a change that happened during a table, for tables that do
// not pin the instant.
type bkChange struct {
	At     time.Duration
	Change BreakerChange
}

// bkRun runs steps against a new breaker and returns it with every change
// it reported.
func bkRun(t *testing.T, cfg policy.Breaker, steps []bkStep) (*Breaker, []bkChange) {
	t.Helper()
	return bkRunOn(t, newBreaker(cfg, bkStart, 1), steps)
}

// bkRunOn runs steps against b.
func bkRunOn(t *testing.T, b *Breaker, steps []bkStep) (*Breaker, []bkChange) {
	t.Helper()
	slots := map[int]BreakerPermit{}
	var changes []bkChange
	note := func(at time.Duration, c BreakerChange) {
		if c.Changed() {
			changes = append(changes, bkChange{at, c})
		}
	}
	for i, st := range steps {
		now := bkStart.Add(st.at)
		where := fmt.Sprintf("step %d (at %v, op %d, slot %d, %v)", i, st.at, st.op, st.slot, st.o)
		var (
			gotOK     bool
			gotRetry  time.Duration
			gotIso    bool
			gotChange BreakerChange
		)
		switch st.op {
		case bkAllow:
			p, d := b.Allow(now)
			note(st.at, d.Change)
			if d.OK {
				slots[st.slot] = p
			}
			gotOK, gotRetry, gotIso, gotChange = d.OK, d.RetryAfter, d.Isolated, d.Change
		case bkDone:
			p := slots[st.slot] // the zero permit if none: never current
			delete(slots, st.slot)
			gotChange = b.Done(now, p, st.o)
			note(st.at, gotChange)
			gotOK = st.ok
		case bkCall:
			p, d := b.Allow(now)
			note(st.at, d.Change)
			gotOK, gotRetry, gotIso, gotChange = d.OK, d.RetryAfter, d.Isolated, d.Change
			if d.OK {
				c := b.Done(now, p, st.o)
				note(st.at, c)
				if c.Changed() {
					gotChange = c
				}
			}
		case bkCheck:
			gotOK = st.ok
		case bkIsolate, bkRelease, bkReset:
			move := map[bkOp]func(time.Time) BreakerChange{bkIsolate: b.Isolate, bkRelease: b.Release, bkReset: b.Reset}[st.op]
			gotChange = move(now)
			note(st.at, gotChange)
			gotOK = st.ok
		}
		if st.loose {
			continue
		}
		if gotOK != st.ok {
			t.Fatalf("%s: ok = %v, want %v", where, gotOK, st.ok)
		}
		if (st.op == bkAllow || st.op == bkCall) && !gotOK && (gotRetry < st.retry[0] || gotRetry > st.retry[1]) {
			t.Fatalf("%s: RetryAfter = %v, want in [%v, %v]", where, gotRetry, st.retry[0], st.retry[1])
		}
		if gotIso != st.iso {
			t.Fatalf("%s: Isolated = %v, want %v", where, gotIso, st.iso)
		}
		if gotChange != st.change {
			t.Fatalf("%s: change = %+v, want %+v", where, gotChange, st.change)
		}
		if got := b.State(now); got != st.state {
			t.Fatalf("%s: state = %v, want %v", where, got, st.state)
		}
		if got, want := b.Isolated(), st.state == policy.BreakerIsolated; got != want {
			t.Fatalf("%s: Isolated() = %v, want %v", where, got, want)
		}
	}
	return b, changes
}

var (
	bkTrip    = BreakerChange{policy.BreakerClosed, policy.BreakerOpen}
	bkProbe   = BreakerChange{policy.BreakerOpen, policy.BreakerHalfOpen}
	bkRecover = BreakerChange{policy.BreakerHalfOpen, policy.BreakerClosed}
	bkReopen  = BreakerChange{policy.BreakerHalfOpen, policy.BreakerOpen}
)

// bkTraffic returns n calls, one every `every` from `from`, failing where
// fail says. Checked traffic must keep the breaker closed throughout;
// loose traffic is not checked.
func bkTraffic(from, every time.Duration, n int, fail func(i int) bool, loose bool) []bkStep {
	steps := make([]bkStep, n)
	for i := range steps {
		o := policy.Success
		if fail(i) {
			o = policy.Failure
		}
		steps[i] = bkStep{at: from + time.Duration(i)*every, op: bkCall, o: o, ok: true, loose: loose}
	}
	return steps
}

// Failure patterns with no more than two failures in a row.
func bkEvery(k int) func(int) bool { return func(i int) bool { return i%k == 0 } }
func bkPct12(i int) bool           { return i%25 == 0 || i%25 == 8 || i%25 == 16 } // 3 in 25
func bkPct35(i int) bool           { return i%20%3 == 0 && i%20 < 19 }             // 7 in 20
func bkNever(int) bool             { return false }

func TestBreakerPct35Pattern(t *testing.T) {
	n := 0
	for i := range 20 {
		if bkPct35(i) {
			n++
		}
	}
	if n != 7 {
		t.Fatalf("bkPct35 fails %d in 20, want 7", n)
	}
}

const bkS = time.Second

func TestBreakerConsecutiveTrip(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 3, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 2}
	bkRun(t, cfg, []bkStep{
		{at: 0, op: bkCall, o: policy.Success, ok: true},
		{at: 1 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 2 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 3 * bkS, op: bkCall, o: policy.Success, ok: true}, // resets the run
		{at: 4 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 5 * bkS, op: bkCall, o: policy.Canceled, ok: true}, // not evidence: the run goes on
		{at: 5 * bkS, op: bkCall, o: policy.Discarded, ok: true},
		{at: 5 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 6 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		// Open until 6s + [4s, 5s).
		{at: 7 * bkS, op: bkAllow, retry: [2]time.Duration{3 * bkS, 4 * bkS}, state: policy.BreakerOpen},
		{at: 9 * bkS, op: bkAllow, retry: [2]time.Duration{1 * bkS, 2 * bkS}, state: policy.BreakerOpen},
		{at: 11 * bkS, op: bkCheck, state: policy.BreakerHalfOpen}, // State reports it; the move is Allow's
		{at: 11 * bkS, op: bkAllow, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 11 * bkS, op: bkDone, ok: true, o: policy.Success, change: bkRecover},
		// Closed again with a fresh run: two failures do not trip.
		{at: 12 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 13 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 14 * bkS, op: bkCall, o: policy.Success, ok: true},
	})
}

func TestBreakerHalfOpenProbes(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 1, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 2}
	full := [2]time.Duration{0, 0} // half-open with every slot taken: no hint
	bkRun(t, cfg, []bkStep{
		{at: 0, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 5 * bkS, op: bkAllow, slot: 0, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 5 * bkS, op: bkAllow, slot: 1, ok: true, state: policy.BreakerHalfOpen},
		{at: 5 * bkS, op: bkAllow, slot: 2, retry: full, state: policy.BreakerHalfOpen},
		// A discarded probe (a hedge loser) records nothing but frees its slot.
		{at: 6 * bkS, op: bkDone, slot: 0, o: policy.Discarded, ok: true, state: policy.BreakerHalfOpen},
		{at: 6 * bkS, op: bkAllow, slot: 2, ok: true, state: policy.BreakerHalfOpen},
		{at: 6 * bkS, op: bkAllow, slot: 3, retry: full, state: policy.BreakerHalfOpen},
		// So does one the caller gave up on.
		{at: 7 * bkS, op: bkDone, slot: 1, o: policy.Canceled, ok: true, state: policy.BreakerHalfOpen},
		{at: 7 * bkS, op: bkAllow, slot: 3, ok: true, state: policy.BreakerHalfOpen},
		// A probe's failure opens again, for a fresh jittered OpenFor.
		{at: 8 * bkS, op: bkDone, slot: 2, o: policy.Failure, ok: true, change: bkReopen, state: policy.BreakerOpen},
		// The other probe's result is from the last generation: ignored.
		{at: 8 * bkS, op: bkDone, slot: 3, o: policy.Success, ok: true, state: policy.BreakerOpen},
		{at: 9 * bkS, op: bkAllow, slot: 4, retry: [2]time.Duration{3 * bkS, 4 * bkS}, state: policy.BreakerOpen},
		{at: 13 * bkS, op: bkAllow, slot: 4, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 13 * bkS, op: bkDone, slot: 4, o: policy.Success, ok: true, change: bkRecover},
		{at: 14 * bkS, op: bkCall, o: policy.Success, ok: true},
	})
}

func TestBreakerLateResultsIgnored(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: 2, OpenFor: 4 * bkS, FirstOpenFor: -1, Probes: 1}
	bkRun(t, cfg, []bkStep{
		{at: 0, op: bkAllow, slot: 0, ok: true}, // closed-state permits that finish late
		{at: 0, op: bkAllow, slot: 1, ok: true},
		{at: 0, op: bkAllow, slot: 5, ok: true},
		{at: 1 * bkS, op: bkCall, o: policy.Failure, ok: true},
		{at: 2 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		{at: 3 * bkS, op: bkDone, slot: 0, o: policy.Failure, ok: true, state: policy.BreakerOpen},
		{at: 3 * bkS, op: bkDone, slot: 1, o: policy.Success, ok: true, state: policy.BreakerOpen},
		{at: 7 * bkS, op: bkAllow, slot: 2, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		{at: 7 * bkS, op: bkAllow, slot: 3, state: policy.BreakerHalfOpen},
		{at: 7 * bkS, op: bkDone, slot: 2, o: policy.Success, ok: true, change: bkRecover},
		{at: 8 * bkS, op: bkAllow, slot: 4, ok: true},
		{at: 8 * bkS, op: bkCall, o: policy.Failure, ok: true}, // one failure in the run
		// A failure from two generations ago does not make it two.
		{at: 9 * bkS, op: bkDone, slot: 5, o: policy.Failure, ok: true},
		// Nor does the zero permit (slot 99 was never filled).
		{at: 9 * bkS, op: bkDone, slot: 99, o: policy.Failure, ok: true},
		{at: 10 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		// A current-generation closed permit finishing after the trip is late too.
		{at: 10 * bkS, op: bkDone, slot: 4, o: policy.Success, ok: true, state: policy.BreakerOpen},
	})
}

func TestBreakerRateRules(t *testing.T) {
	calls := func(start time.Duration, outcomes string) []bkStep {
		var s []bkStep
		for i, c := range outcomes {
			o := policy.Success
			if c == 'F' {
				o = policy.Failure
			}
			s = append(s, bkStep{at: start + time.Duration(i)*bkS, op: bkCall, o: o, ok: true})
		}
		return s
	}
	tripAt := func(s []bkStep) []bkStep {
		s[len(s)-1].change, s[len(s)-1].state = bkTrip, policy.BreakerOpen
		return s
	}
	repeat := func(pattern string, n int) string { return strings.Repeat(pattern, n) }
	// A rate trips when its lower Wilson bound at z = 3 passes the trip
	// point; the counts below are where it first does.
	tests := []struct {
		name  string
		cfg   policy.Breaker
		steps []bkStep
	}{{
		// Warm-up trip point 0.5: 9 of 9 is below MinCalls; 10 of 10 has
		// a lower bound of 0.526 (9 of 10 would have 0.43).
		name:  "MinCalls",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 10},
		steps: append(calls(0, repeat("F", 9)), tripAt(calls(9*bkS, "F"))...),
	}, {
		name:  "MinCalls, not confident",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 10},
		steps: calls(0, "SFFFFFFFFF"), // 9 of 10: a lower bound of 0.43
	}, {
		// With MinCalls 1 a failure alone is no trend; it takes ten in a
		// row for the bound to pass 0.5.
		name:  "two failures",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 1},
		steps: append(calls(0, repeat("F", 9)), tripAt(calls(9*bkS, "F"))...),
	}, {
		// An explicit FailureRatio is read as written, with no confidence
		// bound: half the calls failing trips FailureRatio 0.25 at the
		// first failure with MinCalls in, 4 of 8 (the warm-up trip point's
		// bound would take 14 of 28 to pass 0.25).
		name:  "FailureRatio",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 8, FailureRatio: 0.25},
		steps: tripAt(calls(0, repeat("SF", 4))),
	}, {
		// A host failing every call trips FailureRatio 0.5 at MinCalls, 4
		// of 4 (whose lower bound at z = 3 is 0.31).
		name:  "FailureRatio at MinCalls",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 4, FailureRatio: 0.5},
		steps: append(calls(0, "FFF"), tripAt(calls(3*bkS, "F"))...),
	}, {
		// Below it, no trip: 1 of 4, then 2 of 5; 3 of 6 is at it.
		name:  "FailureRatio, not reached",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 4, FailureRatio: 0.5},
		steps: append(calls(0, "SSSFF"), tripAt(calls(5*bkS, "F"))...),
	}, {
		// No two-failure floor either: FailureRatio 0.05 against MinCalls
		// 20 trips at 1 of 20, as named.
		name:  "FailureRatio, one failure",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 20, FailureRatio: 0.05},
		steps: append(calls(0, repeat("S", 19)), tripAt(calls(19*bkS, "F"))...),
	}, {
		// The derived trip point keeps its bounds beside an explicit
		// FailureRatio above it: 9 of 10 is past the warm-up 0.5 bare,
		// not with confidence (a lower bound of 0.43), and below 0.95.
		name:  "FailureRatio above the relative trip",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 10, FailureRatio: 0.95},
		steps: calls(0, "SFFFFFFFFF"),
	}, {
		name:  "consecutive off",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 100},
		steps: calls(0, repeat("F", 50)),
	}, {
		// 10 failures in 13 calls would pass 0.5; the first ten have
		// left the window by the time the last three come.
		name:  "old outcomes leave the window",
		cfg:   policy.Breaker{ConsecutiveFailures: -1, MinCalls: 2, Window: 40 * bkS},
		steps: append(calls(0, repeat("F", 9)), calls(60*bkS, "FFF")...),
	}, {
		// Closing starts an empty window: the failures that tripped it
		// do not count again.
		name: "closing empties the window",
		cfg:  policy.Breaker{ConsecutiveFailures: -1, MinCalls: 4, OpenFor: 4 * bkS},
		steps: append(tripAt(calls(0, repeat("F", 10))),
			bkStep{at: 12 * bkS, op: bkAllow, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
			bkStep{at: 12 * bkS, op: bkDone, o: policy.Success, ok: true, change: bkRecover},
			bkStep{at: 13 * bkS, op: bkCall, o: policy.Failure, ok: true},
			bkStep{at: 14 * bkS, op: bkCall, o: policy.Failure, ok: true},
			bkStep{at: 15 * bkS, op: bkCall, o: policy.Failure, ok: true},
			bkStep{at: 16 * bkS, op: bkCall, o: policy.Success, ok: true},
		),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { bkRun(t, tt.cfg, tt.steps) })
	}
}

// TestBreakerRelativeTrip runs a dependency through a learned baseline and
// then a change, with a call every 100ms.
func TestBreakerRelativeTrip(t *testing.T) {
	const every = 100 * time.Millisecond
	cfg := policy.Breaker{MinCalls: 20, Window: 40 * bkS} // ConsecutiveFailures 5: never reached
	phase := func(from time.Duration, fail func(int) bool, loose bool) []bkStep {
		return bkTraffic(from, every, 2000, fail, loose) // 200s: five Windows
	}
	tests := []struct {
		name     string
		baseline func(int) bool
		then     func(int) bool
		trips    bool
		wantBase float64 // after the baseline phase
	}{
		{"10% then 12% holds", bkEvery(10), bkPct12, false, 0.1},
		{"10% then 50% trips", bkEvery(10), bkEvery(2), true, 0.1},
		// 35% over a 10% baseline (trip point 0.3) is not past it with
		// confidence; with random failures a run of six would trip it.
		{"10% then 35% holds by rate", bkEvery(10), bkPct35, false, 0.1},
		{"20% then 35% holds", bkEvery(5), bkPct35, false, 0.2},
		{"0% then 35% trips", bkNever, bkPct35, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := bkRun(t, cfg, phase(0, tt.baseline, false))
			r := b.Rate(bkStart.Add(200 * bkS))
			if !r.BaselineKnown || math.Abs(r.Baseline-tt.wantBase) > 1e-9 {
				t.Fatalf("after the baseline phase: Rate = %+v, want baseline %v", r, tt.wantBase)
			}
			if want := max(0.2, 3*tt.wantBase); math.Abs(r.TripPoint-want) > 1e-9 {
				t.Fatalf("after the baseline phase: TripPoint = %v, want %v", r.TripPoint, want)
			}

			steps := append(phase(0, tt.baseline, false), phase(200*bkS, tt.then, tt.trips)...)
			_, changes := bkRun(t, cfg, steps)
			if !tt.trips {
				return // bkRun checked that every call was admitted and the breaker stayed closed
			}
			if len(changes) == 0 || changes[0].Change != bkTrip {
				t.Fatalf("changes = %+v, want a trip", changes)
			}
			// The window is 40s of which at least 30s is summed: the trip
			// comes once enough of it holds the new rate.
			if at := changes[0].At; at < 200*bkS || at > 240*bkS {
				t.Fatalf("tripped at %v, want in [200s, 240s]", at)
			}
		})
	}
}

// A fresh scope has no baseline: its trip point is 0.5, so a dependency
// that fails 35% of the time from the start is learned, not tripped.
func TestBreakerWarmup(t *testing.T) {
	cfg := policy.Breaker{MinCalls: 20, Window: 40 * bkS}
	b, _ := bkRun(t, cfg, bkTraffic(0, 100*time.Millisecond, 2000, bkPct35, false))
	r := b.Rate(bkStart.Add(200 * bkS))
	if want := 0.35; !r.BaselineKnown || math.Abs(r.Baseline-want) > 1e-9 {
		t.Fatalf("Rate = %+v, want baseline %v", r, want)
	}
	if r0 := newBreaker(cfg, bkStart, 1).Rate(bkStart); r0.BaselineKnown || r0.TripPoint != 0.5 {
		t.Fatalf("fresh Rate = %+v, want no baseline and trip point 0.5", r0)
	}
}

// With a baseline of zero the floor decides: at MinCalls 20, one
// failure never trips, and it takes a rate above 0.2 with confidence: after
// 19 successes, 14 failures (the lower bound of 14 in 33 is 0.211).
func TestBreakerNearZeroBaseline(t *testing.T) {
	cfg := policy.Breaker{ConsecutiveFailures: -1, MinCalls: 20, Window: 40 * bkS}
	steps := bkTraffic(0, bkS, 200, bkNever, false) // 0% for 200s
	// Idle until 300s: the window empties. Then 19 successes and failures.
	steps = append(steps, bkTraffic(300*bkS, bkS, 19, bkNever, false)...)
	steps = append(steps, bkTraffic(319*bkS, bkS, 13, func(int) bool { return true }, false)...)
	steps = append(steps, bkStep{at: 332 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen})
	b, _ := bkRun(t, cfg, steps[:200])
	if r := b.Rate(bkStart.Add(250 * bkS)); !r.BaselineKnown || r.Baseline != 0 || r.TripPoint != 0.2 {
		t.Fatalf("Rate = %+v, want a known baseline of 0 and the floor 0.2", r)
	}
	bkRun(t, cfg, steps)
}

func TestBreakerRateReport(t *testing.T) {
	b := newBreaker(policy.Breaker{ConsecutiveFailures: -1, MinCalls: 4, FailureRatio: 0.4}, bkStart, 1)
	now := bkStart
	for _, o := range []policy.Outcome{policy.Success, policy.Failure, policy.Success, policy.Success, policy.Discarded, policy.Canceled} {
		p, _ := b.Allow(now)
		b.Done(now, p, o)
	}
	got := b.Rate(now)
	want := BreakerRate{Calls: 4, Failures: 1, ErrorRate: 0.25, TripPoint: 0.4, MinCalls: 4}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Rate (-want +got):\n%s", diff)
	}
	if got.Judged() || got.Reached(0.5) {
		t.Fatalf("one failure: Judged = %v, Reached(0.5) = %v, want false", got.Judged(), got.Reached(0.5))
	}
	// The next failure puts the rate at FailureRatio, 2 of 5, and trips.
	p, _ := b.Allow(now)
	if c := b.Done(now, p, policy.Failure); c != bkTrip {
		t.Fatalf("2 of 5 failed against FailureRatio 0.4: change %+v, want a trip", c)
	}
	// Without FailureRatio, the rate is judged from two failures on, and
	// reaches the trip point (0.5 while warming up) before the breaker,
	// which waits for the rate's lower bound to pass it, trips.
	b = newBreaker(policy.Breaker{ConsecutiveFailures: -1, MinCalls: 4}, bkStart, 1)
	for b.State(now) == policy.BreakerClosed {
		got = b.Rate(now)
		p, _ := b.Allow(now)
		b.Done(now, p, policy.Failure)
	}
	if !got.Judged() || !got.Reached(1) || got.Failures < 5 {
		t.Fatalf("Rate before the trip = %+v: want judged, reached, and more than the bare 2 of 2", got)
	}
}

// TestBreakerJitter checks that each opening lasts OpenFor × [1, 1.25),
// differently for different seeds, the same for the same seed, and drawn
// afresh when a probe fails.
func TestBreakerJitter(t *testing.T) {
	const openFor = 4 * bkS
	cfg := policy.Breaker{ConsecutiveFailures: 1, OpenFor: openFor, FirstOpenFor: -1}
	trip := func(b *Breaker, now time.Time) time.Duration {
		p, d := b.Allow(now)
		if !d.OK {
			t.Fatalf("Allow refused before the trip")
		}
		if c := b.Done(now, p, policy.Failure); !c.Changed() || c.To != policy.BreakerOpen {
			t.Fatalf("Done = %+v, want a move to open", c)
		}
		_, d = b.Allow(now)
		return d.RetryAfter
	}
	const seeds = 1000
	seen := map[time.Duration]bool{}
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	redrawn := 0
	for seed := uint64(0); seed < seeds; seed++ {
		b := newBreaker(cfg, bkStart, seed)
		first := trip(b, bkStart)
		if again := trip(newBreaker(cfg, bkStart, seed), bkStart); again != first {
			t.Fatalf("seed %d: %v then %v: not deterministic", seed, first, again)
		}
		// Go half-open and fail the probe: a fresh draw.
		later := bkStart.Add(time.Duration(float64(openFor) * 1.25))
		second := trip(b, later)
		if second != first {
			redrawn++
		}
		for _, d := range []time.Duration{first, second} {
			if d < openFor || d >= openFor*5/4 {
				t.Fatalf("seed %d: open for %v, want in [%v, %v)", seed, d, openFor, openFor*5/4)
			}
			seen[d] = true
			lo, hi = min(lo, d), max(hi, d)
		}
	}
	if len(seen) < 2*seeds*99/100 || redrawn < seeds*99/100 {
		t.Fatalf("%d distinct openings of %d, %d redrawn of %d: jitter is not spreading", len(seen), 2*seeds, redrawn, seeds)
	}
	// 2000 uniform draws leave gaps of about 1/2000 of the range at the ends.
	if span := openFor / 4; lo > openFor+span/100 || hi < openFor+span*99/100 {
		t.Fatalf("openings span [%v, %v], want close to [%v, %v)", lo, hi, openFor, openFor+span)
	}
}

func TestBreakerDefaults(t *testing.T) {
	got := policy.Breaker{}.WithDefaults()
	want := policy.Breaker{MinCalls: 20, Window: 30 * bkS, FirstOpenFor: bkS, OpenFor: 5 * bkS, Probes: 3}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("WithDefaults (-want +got):\n%s", diff)
	}
	if got := (policy.Breaker{OpenFor: 200 * time.Millisecond}).WithDefaults().FirstOpenFor; got != 200*time.Millisecond {
		t.Fatalf("FirstOpenFor with a short OpenFor = %v, want OpenFor", got)
	}
	// Defaults in action: five failures in a row trip a fresh breaker;
	// the first opening lasts a second; three probes.
	steps := bkTraffic(0, bkS, 4, func(int) bool { return true }, false)
	steps = append(steps,
		bkStep{at: 4 * bkS, op: bkCall, o: policy.Failure, ok: true, change: bkTrip, state: policy.BreakerOpen},
		bkStep{at: 4 * bkS, op: bkAllow, retry: [2]time.Duration{bkS, bkS + 250*time.Millisecond}, state: policy.BreakerOpen},
		bkStep{at: 6 * bkS, op: bkAllow, slot: 0, ok: true, change: bkProbe, state: policy.BreakerHalfOpen},
		bkStep{at: 6 * bkS, op: bkAllow, slot: 1, ok: true, state: policy.BreakerHalfOpen},
		bkStep{at: 6 * bkS, op: bkAllow, slot: 2, ok: true, state: policy.BreakerHalfOpen},
		bkStep{at: 6 * bkS, op: bkAllow, slot: 3, state: policy.BreakerHalfOpen},
	)
	bkRun(t, policy.Breaker{}, steps)
}

func TestBreakerAllocs(t *testing.T) {
	b := newBreaker(policy.Breaker{ConsecutiveFailures: -1, MinCalls: 1 << 30}, bkStart, 1)
	now := bkStart
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond) // crosses slices of the window
		p, d := b.Allow(now)
		if !d.OK {
			t.Fatal("refused while closed")
		}
		o := policy.Success
		if i++; i%3 == 0 {
			o = policy.Failure
		}
		b.Done(now, p, o)
		_ = b.Rate(now)
		_ = b.State(now)
	})
	if allocs != 0 {
		t.Fatalf("closed Allow+Done: %v allocs, want 0", allocs)
	}

	b = newBreaker(policy.Breaker{ConsecutiveFailures: 1, Probes: 1, OpenFor: 4 * bkS}, bkStart, 1)
	p, _ := b.Allow(bkStart)
	b.Done(bkStart, p, policy.Failure)
	allocs = testing.AllocsPerRun(1000, func() {
		if _, d := b.Allow(bkStart.Add(bkS)); d.OK || d.RetryAfter == 0 {
			t.Fatal("admitted while open")
		}
	})
	if allocs != 0 {
		t.Fatalf("open refusal: %v allocs, want 0", allocs)
	}
	later := bkStart.Add(time.Minute)
	probe, _ := b.Allow(later) // half-open, its one slot taken
	allocs = testing.AllocsPerRun(1000, func() {
		if _, d := b.Allow(later); d.OK {
			t.Fatal("admitted beyond Probes")
		}
		b.Done(later, probe, policy.Discarded) // gives the slot back
		if probe, _ = b.Allow(later); !probe.probe {
			t.Fatal("no probe slot after a discarded probe")
		}
	})
	if allocs != 0 {
		t.Fatalf("half-open Allow+Done(policy.Discarded): %v allocs, want 0", allocs)
	}
}

func TestBreakerConcurrent(t *testing.T) {
	b := newBreaker(policy.Breaker{ConsecutiveFailures: 3, MinCalls: 10, Window: bkS, OpenFor: 10 * time.Millisecond, Probes: 2}, bkStart, 7)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[BreakerChange]int{}
	)
	for g := range 8 {
		wg.Go(func() {
			local := map[BreakerChange]int{}
			for i := range 3000 {
				// Time moves forward for everyone together, roughly.
				now := bkStart.Add(time.Duration(i) * time.Millisecond)
				p, d := b.Allow(now)
				local[d.Change]++
				if !d.OK {
					continue
				}
				var o policy.Outcome
				switch {
				case i%50 < 25:
					o = policy.Success
				case (i+g)%5 == 0:
					o = policy.Discarded
				case (i+g)%5 == 1:
					o = policy.Canceled
				default:
					o = policy.Failure
				}
				local[b.Done(now, p, o)]++
			}
			mu.Lock()
			for c, n := range local {
				counts[c] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	// Every trip and reopen is followed by exactly one move to half-open,
	// give or take the last one.
	opens := counts[bkTrip] + counts[bkReopen]
	if opens == 0 || counts[bkProbe] < opens-1 || counts[bkProbe] > opens {
		t.Fatalf("changes %v: opens and probes do not pair up", counts)
	}
	if got := counts[bkProbe] - counts[bkRecover] - counts[bkReopen]; got < 0 || got > 1 {
		t.Fatalf("changes %v: half-open entered and left do not pair up", counts)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probesOut != 0 && b.state == policy.BreakerHalfOpen {
		t.Fatalf("%d probes still out after every permit was released", b.probesOut)
	}
}

func TestNilGatesAdmit(t *testing.T) {
	var b *Breaker
	p, d := b.Allow(bkStart)
	if !d.OK || b.Done(bkStart, p, policy.Failure).Changed() || b.State(bkStart) != policy.BreakerClosed || b.Rate(bkStart) != (BreakerRate{}) {
		t.Fatal("a nil Breaker must admit and record nothing")
	}
	var g *Bulkhead
	if !g.Acquire(t.Context()) || g.InFlight() != 0 || g.waiters() != 0 {
		t.Fatal("a nil Bulkhead must admit")
	}
	g.Release()
	var l *RateLimiter
	if ok, _ := l.Acquire(t.Context(), bkStart); !ok || !math.IsInf(l.available(bkStart), 1) {
		t.Fatal("a nil RateLimiter must admit")
	}
}
