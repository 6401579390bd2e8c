package lane

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pool is a test lane's pool: its address and index, as open saw them.
type pool struct {
	addr  string
	index int
}

func open(addr string, index int) pool { return pool{addr, index} }

func newSet(cfg policy.Replicas) *Set[pool] {
	return New(cfg.WithDefaults(), t0, open)
}

// stub is a Resolver for configs; the Set never calls it.
type stub struct{}

func (stub) Resolve(_ context.Context, _ string) ([]string, error) { return nil, nil }

// picks takes n lanes at now, each done at once with latency and outcome
// from f, and returns how many went to each index.
func picks(s *Set[pool], now time.Time, n int, f func(*Lane[pool]) (time.Duration, policy.Outcome)) map[int]int {
	got := map[int]int{}
	for range n {
		l := s.Take(now, 0)
		got[l.Index]++
		lat, o := f(l)
		s.Done(l, now, lat, o, Answer{})
	}
	return got
}

func TestTakeSpreadsOverEqualLanes(t *testing.T) {
	s := newSet(policy.Replicas{})
	got := picks(s, t0, 4000, func(*Lane[pool]) (time.Duration, policy.Outcome) { return 10 * time.Millisecond, policy.Success })
	for i := range 4 {
		if got[i] < 700 || got[i] > 1300 {
			t.Errorf("lane %d got %d of 4000 picks, want about 1000: %v", i, got[i], got)
		}
	}
}

func TestTakeAvoidsASlowLane(t *testing.T) {
	s := newSet(policy.Replicas{})
	now := t0
	lat := func(l *Lane[pool]) (time.Duration, policy.Outcome) {
		if l.Index == 2 {
			return 100 * time.Millisecond, policy.Success
		}
		return 10 * time.Millisecond, policy.Success
	}
	got := map[int]int{}
	for range 4000 {
		now = now.Add(time.Millisecond)
		for i, n := range picks(s, now, 1, lat) {
			got[i] += n
		}
	}
	if got[2] > 4000/20 {
		t.Errorf("the slow lane got %d of 4000 picks, want under 5%%: %v", got[2], got)
	}
}

func TestALaneWithNoSampleGetsOneProbeAtATime(t *testing.T) {
	s := newSet(policy.Replicas{})
	// Lanes 1 to 3 answered in 2ms; lane 0 has never answered.
	for i := 1; i < 4; i++ {
		s.Done(s.Take(t0, 0b1111&^(1<<i)), t0, 2*time.Millisecond, policy.Success, Answer{})
	}
	probe := s.Take(t0, 0b1110)
	if probe.Index != 0 {
		t.Fatalf("took lane %d, want lane 0", probe.Index)
	}
	// With the probe in flight, lane 0 costs more than the others at 8
	// attempts each.
	var held []*Lane[pool]
	for range 24 {
		l := s.Take(t0, 0)
		if l.Index == 0 {
			t.Fatalf("lane 0 taken again with its probe in flight and %d attempts on the others", len(held))
		}
		held = append(held, l)
	}
	// Its answer, 40ms, is its estimate: it is left alone.
	s.Done(probe, t0, 40*time.Millisecond, policy.Success, Answer{})
	for _, l := range held {
		s.Done(l, t0, 2*time.Millisecond, policy.Success, Answer{})
	}
	if got := picks(s, t0, 100, func(*Lane[pool]) (time.Duration, policy.Outcome) { return 2 * time.Millisecond, policy.Success }); got[0] != 0 {
		t.Errorf("lane 0, answering in 40ms, got %d of 100 picks beside lanes answering in 2ms: %v", got[0], got)
	}
}

func TestALaneSlowInARowIsEjected(t *testing.T) {
	// Lanes 1 to 3 answer in 2ms; lane 0 as slow gives, in turns with
	// them (the picker alone would leave it alone).
	run := func(t *testing.T, cfg policy.Replicas, slowLanes int, slow func(k int) time.Duration) []Ejection[pool] {
		t.Helper()
		s := newSet(cfg)
		now := t0
		var ejected []Ejection[pool]
		for k := range 400 {
			now = now.Add(time.Millisecond)
			l := s.Take(now, 0b1111&^(1<<(k%4)))
			lat := 2 * time.Millisecond
			if l.Index < slowLanes {
				lat = slow(k / 4)
			}
			ejected = append(ejected, s.Done(l, now, lat, policy.Success, Answer{}).Ejected...)
		}
		return ejected
	}
	always := func(int) time.Duration { return 40 * time.Millisecond }
	t.Run("20x slower", func(t *testing.T) {
		e := run(t, policy.Replicas{}, 1, always)
		if len(e) != 1 || e[0].Lane.Index != 0 || e[0].Reason != policy.EjectLatency || e[0].For != 30*time.Second {
			t.Errorf("ejected %+v, want lane 0 for its latency, for 30s", e)
		}
	})
	t.Run("20x slower, after a stall on every lane", func(t *testing.T) {
		// Every lane's first answer takes 50ms, then lane 0's 40ms and
		// the others' 2ms, a lane answering every 20ms: the peak
		// estimates stay above 10ms for over 10s, the typical latencies
		// are under 8ms in 2s.
		s := newSet(policy.Replicas{})
		now := t0
		var e []Ejection[pool]
		for k := range 1600 { // 8s
			now = now.Add(5 * time.Millisecond)
			l := s.Take(now, 0b1111&^(1<<(k%4)))
			lat := 2 * time.Millisecond
			switch {
			case k < 4:
				lat = 50 * time.Millisecond
			case l.Index == 0:
				lat = 40 * time.Millisecond
			}
			e = append(e, s.Done(l, now, lat, policy.Success, Answer{}).Ejected...)
		}
		if len(e) != 1 || e[0].Lane.Index != 0 || e[0].Reason != policy.EjectLatency {
			t.Errorf("ejected %+v, want lane 0 for its latency", e)
		}
	})
	t.Run("three slow of four", func(t *testing.T) {
		// The lowest of the others' estimates is the baseline, not their
		// median: MaxEjected (two) of the three go.
		e := run(t, policy.Replicas{}, 3, always)
		if len(e) != 2 || e[0].Reason != policy.EjectLatency || e[1].Reason != policy.EjectLatency {
			t.Errorf("ejected %+v, want two lanes for their latency", e)
		}
	})
	for _, tt := range []struct {
		name string
		slow func(k int) time.Duration
	}{
		{"4x slower", func(int) time.Duration { return 8 * time.Millisecond }},
		{"a stall in four answers", func(k int) time.Duration {
			if k%4 == 0 {
				return 40 * time.Millisecond
			}
			return 2 * time.Millisecond
		}},
		{"a hedge cut short at 5ms each time", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e []Ejection[pool]
			if tt.slow != nil {
				e = run(t, policy.Replicas{}, 1, tt.slow)
			} else {
				// Discarded lower bounds below the trip count nothing.
				s := newSet(policy.Replicas{})
				now := t0
				for k := range 400 {
					now = now.Add(time.Millisecond)
					l := s.Take(now, 0b1111&^(1<<(k%4)))
					o, lat := policy.Success, 2*time.Millisecond
					if l.Index == 0 {
						o, lat = policy.Discarded, 5*time.Millisecond
					}
					e = append(e, s.Done(l, now, lat, o, Answer{}).Ejected...)
				}
			}
			if len(e) != 0 {
				t.Errorf("ejected %+v, want none", e)
			}
		})
	}
}

func TestAFastFailureIsASlowSample(t *testing.T) {
	// Address lanes, which are never placed anew: a connection lane
	// failing alone starts over on a new connection until it succeeds
	// (TestAConnectionLaneFailingAloneIsDialedAnew), and only its
	// failures in a row, which ejection is off for here, bound it.
	s := newSet(policy.Replicas{Endpoints: stub{}, ConsecutiveFailures: -1, MaxEjected: -1})
	s.StartRefresh(t0)
	s.Update(t0, []string{"a", "b", "c", "d"}, nil)
	now := t0
	res := func(l *Lane[pool]) (time.Duration, policy.Outcome) {
		if l.Index == 0 {
			return 100 * time.Microsecond, policy.Failure
		}
		return 20 * time.Millisecond, policy.Success
	}
	got := map[int]int{}
	for range 4000 {
		now = now.Add(time.Millisecond)
		for i, n := range picks(s, now, 1, res) {
			got[i] += n
		}
	}
	if got[0] > 4000/20 {
		t.Errorf("the lane failing in 100µs got %d of 4000 picks, want under 5%%: %v", got[0], got)
	}
}

func TestTakePrefersLanesTheCallHasNotUsed(t *testing.T) {
	s := newSet(policy.Replicas{})
	for range 1000 {
		var used uint64
		for i := range 4 {
			l := s.Take(t0, used)
			if used&(1<<l.Index) != 0 {
				t.Fatalf("pick %d reused lane %d with %04b used", i, l.Index, used)
			}
			used |= 1 << l.Index
			s.Done(l, t0, time.Millisecond, policy.Success, Answer{})
		}
		if used != 0b1111 {
			t.Fatalf("four picks used %04b, want every lane", used)
		}
		// All used: any lane may be reused.
		l := s.Take(t0, used)
		s.Done(l, t0, time.Millisecond, policy.Success, Answer{})
	}
}

func TestConsecutiveFailuresEjectForAGrowingTime(t *testing.T) {
	s := newSet(policy.Replicas{EjectFor: 30 * time.Second, MaxEjectFor: 100 * time.Second})
	lanes := s.view.Load().lanes
	bad := lanes[1]
	now := t0
	// Keep the others succeeding so the bad lane is an outlier; take
	// the bad lane by marking the others used.
	others := uint64(0b1101)
	fail := func() Report[pool] {
		l := s.Take(now, others)
		if l != bad {
			t.Fatalf("took lane %d, want the only unused one, 1", l.Index)
		}
		return s.Done(l, now, time.Millisecond, policy.Failure, Answer{})
	}
	for _, want := range []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second, 100 * time.Second} {
		for i := range 4 {
			if rep := fail(); len(rep.Ejected) != 0 {
				t.Fatalf("ejected after %d failures, want 5", i+1)
			}
		}
		rep := fail()
		if len(rep.Ejected) != 1 || rep.Ejected[0].Lane.Index != 1 || rep.Ejected[0].Reason != policy.EjectConsecutive || rep.Ejected[0].For != want {
			t.Fatalf("fifth failure: ejected %+v, want lane 1 for %v by Consecutive", rep.Ejected, want)
		}
		if !rep.Explained {
			t.Error("the ejecting failure is not explained by its lane")
		}
		if ej := s.Counts(now).Ejected; ej != 1 {
			t.Errorf("Counts: %d ejected, want 1", ej)
		}
		if rep.Drained != bad {
			t.Errorf("the ejecting failure, the lane's last attempt in flight, drained %v, want the lane", rep.Drained)
		}
		// Ejected: not picked while others are left, even unused.
		for range 100 {
			l := s.Take(now.Add(want-time.Nanosecond), 0)
			if l == bad {
				t.Fatal("an ejected lane was picked")
			}
			s.Done(l, now, time.Millisecond, policy.Success, Answer{})
		}
		// Back when its time is up.
		now = now.Add(want)
		if ej := s.Counts(now).Ejected; ej != 0 {
			t.Errorf("Counts after the ejection: %d ejected, want 0", ej)
		}
	}
}

// TestALaneEjectedAgainAfterItsReturnIsReportedEjected: a lane back from
// an ejection whose hedge legs, lost and slow, eject it again is reported
// back from the first ejection, then ejected; the Success of an attempt
// it had in flight, which ends during the second ejection, reports no
// return. Reporting the second ejection as the lane's return would tell
// the observer that a lane ejected for a minute is open.
func TestALaneEjectedAgainAfterItsReturnIsReportedEjected(t *testing.T) {
	s := newSet(policy.Replicas{})
	now := t0
	var events []string
	note := func(rep Report[pool]) {
		if e := rep.Returned; e.Lane != nil {
			events = append(events, fmt.Sprintf("returned %d %v %v", e.Lane.Index, e.Reason, e.For))
		}
		for _, e := range rep.Ejected {
			events = append(events, fmt.Sprintf("ejected %d %v %v", e.Lane.Index, e.Reason, e.For))
		}
	}
	// One attempt on each lane in turn, lane 0's ending with o after lat,
	// the others' in 2ms.
	round := func(o policy.Outcome, lat time.Duration) {
		for i := range 4 {
			now = now.Add(time.Millisecond)
			l := s.Take(now, 0b1111&^(1<<i))
			if l.Index != i {
				t.Fatalf("took lane %d, want %d", l.Index, i)
			}
			if i == 0 {
				note(s.Done(l, now, lat, o, Answer{}))
			} else {
				note(s.Done(l, now, 2*time.Millisecond, policy.Success, Answer{}))
			}
		}
	}
	bad := s.view.Load().lanes[0]
	for range 5 {
		round(policy.Failure, time.Millisecond)
	}
	if !bad.ejectedAt(s.nanos(now)) {
		t.Fatalf("lane 0 not ejected after five failures in a row: %q", events)
	}
	now = now.Add(30 * time.Second)
	inFlight := s.Take(now, 0b1110)
	for k := 0; !bad.ejectedAt(s.nanos(now)); k++ {
		if k == 20 {
			t.Fatalf("lane 0 not ejected again by 20 hedge losses 20 times slower than the others: %q", events)
		}
		round(policy.Discarded, 40*time.Millisecond)
	}
	note(s.Done(inFlight, now, 50*time.Millisecond, policy.Success, Answer{}))
	want := []string{"ejected 0 consecutive 30s", "returned 0 consecutive 30s", "ejected 0 latency 1m0s"}
	if !slices.Equal(events, want) {
		t.Errorf("reported %q, want %q", events, want)
	}

	t.Run("before any attempt of its ended", func(t *testing.T) {
		// The key idle through the first ejection, the interval that
		// saw it close after: the lane, back and not attempted yet, is
		// ejected again for its rate, and was never back as far as its
		// reports go.
		s = newSet(policy.Replicas{ConsecutiveFailures: 20})
		now, events = t0, nil
		inFlight := s.Take(now, 0b1110)
		for range 7 {
			round(policy.Failure, time.Millisecond)
		}
		for range 13 {
			now = now.Add(time.Millisecond)
			note(s.Done(s.Take(now, 0b1110), now, time.Millisecond, policy.Failure, Answer{}))
		}
		now = now.Add(30 * time.Second)
		note(s.Done(s.Take(now, 0b1101), now, 2*time.Millisecond, policy.Success, Answer{}))
		note(s.Done(inFlight, now, 50*time.Millisecond, policy.Success, Answer{}))
		want := []string{"ejected 0 consecutive 30s", "ejected 0 rate 1m0s"}
		if !slices.Equal(events, want) {
			t.Errorf("reported %q, want %q", events, want)
		}
	})
}

func TestAHealthyIntervalTakesOneOffTheEjectionCount(t *testing.T) {
	s := newSet(policy.Replicas{})
	bad := s.view.Load().lanes[0]
	now := t0
	eject := func() time.Duration {
		for range 5 {
			l := s.Take(now, 0b1110)
			if rep := s.Done(l, now, time.Millisecond, policy.Failure, Answer{}); len(rep.Ejected) == 1 {
				return rep.Ejected[0].For
			}
		}
		t.Fatal("five failures ejected nothing")
		return 0
	}
	if d := eject(); d != 30*time.Second {
		t.Fatalf("first ejection %v, want 30s", d)
	}
	now = now.Add(30 * time.Second)
	if d := eject(); d != 60*time.Second {
		t.Fatalf("second ejection %v, want 60s", d)
	}
	// Back, then two healthy intervals (an outcome closes each).
	now = now.Add(60 * time.Second)
	for range 2 {
		now = now.Add(interval)
		s.Done(s.Take(now, 0b1110), now, time.Millisecond, policy.Success, Answer{})
	}
	if bad.ejections != 0 {
		t.Fatalf("ejection count %d after two healthy intervals, want 0", bad.ejections)
	}
	if d := eject(); d != 30*time.Second {
		t.Fatalf("ejection after healthy intervals %v, want 30s again", d)
	}
}

func TestAtMostMaxEjectedAtOnce(t *testing.T) {
	for _, tt := range []struct {
		lanes int
		max   float64
		want  int
	}{
		{4, 0.5, 2},
		{4, 0.1, 1}, // at least one of two or more
		{4, 1, 3},   // never all
		{2, 0.5, 1},
		{1, 1, 0}, // a lone lane is the key's breaker's to judge
		{4, -1, 0},
	} {
		s := newSet(policy.Replicas{Connections: tt.lanes, MaxEjected: tt.max})
		for range 50 {
			l := s.Take(t0, 0)
			s.Done(l, t0, time.Millisecond, policy.Failure, Answer{})
		}
		if ej := s.Counts(t0).Ejected; ej != tt.want {
			t.Errorf("%d lanes all failing, MaxEjected %v: %d ejected, want %d", tt.lanes, tt.max, ej, tt.want)
		}
	}
}

func TestARateFarAboveTheOthersEjects(t *testing.T) {
	for _, tt := range []struct {
		name  string
		bad   int // one failure in bad on lane 0; 0: none
		other int // one failure in other on the other lanes; 0: none
		eject bool
	}{
		{"half of lane 0 fails, the others never", 2, 0, true},
		{"a third of lane 0 fails, the others never", 3, 0, true},
		{"a fifth of lane 0 fails, the others a tenth", 5, 10, false}, // trip min(0.9, max(0.2, 0.3)) = 0.3
		{"half of every lane fails", 2, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSet(policy.Replicas{ConsecutiveFailures: -1})
			now := t0
			var ejected []Ejection[pool]
			n := map[int]int{}
			for k := range 400 {
				// Round robin, by marking the other lanes used: the
				// picker would starve the failing lane, and its rate
				// needs minCalls outcomes to be judged.
				now = now.Add(interval / 200)
				l := s.Take(now, 0b1111&^(1<<(k%4)))
				n[l.Index]++
				o := policy.Success
				every := tt.other
				if l.Index == 0 {
					every = tt.bad
				}
				if every > 0 && n[l.Index]%every == 0 {
					o = policy.Failure
				}
				ejected = append(ejected, s.Done(l, now, time.Millisecond, o, Answer{}).Ejected...)
			}
			switch {
			case tt.eject && (len(ejected) != 1 || ejected[0].Lane.Index != 0 || ejected[0].Reason != policy.EjectRate):
				t.Errorf("ejected %+v, want lane 0 by Rate", ejected)
			case !tt.eject && len(ejected) != 0:
				t.Errorf("ejected %+v, want none", ejected)
			}
		})
	}
}

func TestOneBadLaneExplainsItsFailuresAndAllBadExplainNone(t *testing.T) {
	t.Run("one bad of four", func(t *testing.T) {
		s := newSet(policy.Replicas{})
		unexplained := 0
		now := t0
		for range 2000 {
			now = now.Add(5 * time.Millisecond)
			l := s.Take(now, 0)
			o := policy.Success
			if l.Index == 3 {
				o = policy.Failure
			}
			if rep := s.Done(l, now, time.Millisecond, o, Answer{}); o == policy.Failure && !rep.Explained {
				unexplained++
			}
		}
		// The first failure of each run is the key's evidence; the
		// ejections (30 s, 60 s) leave room for two runs in 10 s.
		if unexplained > 3 {
			t.Errorf("%d failures of the bad lane reach the key, want at most 3", unexplained)
		}
	})
	t.Run("all four bad", func(t *testing.T) {
		s := newSet(policy.Replicas{})
		unexplained := 0
		for range 100 {
			l := s.Take(t0, 0)
			if rep := s.Done(l, t0, time.Millisecond, policy.Failure, Answer{}); !rep.Explained {
				unexplained++
			}
		}
		// Two lanes may be ejected; the other two's failures all reach
		// the key.
		if unexplained < 90 {
			t.Errorf("only %d of 100 failures reach the key with every lane failing, want at least 90", unexplained)
		}
	})
}

func TestARetryAfterHoldsItsLane(t *testing.T) {
	s := newSet(policy.Replicas{ConsecutiveFailures: -1})
	for _, used := range []uint64{0b1110, 0b1011, 0b0111} { // lanes 0, 2 and 3 answered
		s.Done(s.Take(t0, used), t0, time.Millisecond, policy.Success, Answer{})
	}
	l := s.Take(t0, 0b1101)
	rep := s.Done(l, t0, time.Millisecond, policy.Failure, Answer{Hold: 5 * time.Second})
	if !rep.Held || !rep.Explained {
		t.Fatalf("a 503 with Retry-After on lane 1: %+v, want held and explained", rep)
	}
	// Retry-After counts whole seconds: the hold may be over after 4s.
	for range 100 {
		l := s.Take(t0.Add(4*time.Second-1), 0)
		if l.Index == 1 {
			t.Fatal("a held lane was picked")
		}
		s.Done(l, t0, 0, policy.Canceled, Answer{})
	}
	probes := 0
	for range 16 {
		if l := s.Take(t0.Add(4*time.Second), 0); l.Index == 1 {
			probes++
		}
	}
	if probes != 1 {
		t.Fatalf("%d of 16 attempts on the lane when its hold may be over, want one probe", probes)
	}

	t.Run("a shorter hint", func(t *testing.T) {
		s := newSet(policy.Replicas{ConsecutiveFailures: -1})
		s.Done(s.Take(t0, 0b1110), t0, time.Millisecond, policy.Success, Answer{})
		rep := s.Done(s.Take(t0, 0b1101), t0, time.Millisecond, policy.Failure, Answer{Hold: time.Second, Hint: 200 * time.Millisecond})
		if !rep.Held {
			t.Fatal("not held")
		}
		for range 100 {
			if l := s.Take(t0.Add(200*time.Millisecond-1), 0); l.Index == 1 {
				t.Fatal("a held lane was picked within its hint")
			}
		}
		if l := s.Take(t0.Add(200*time.Millisecond), 0b1101); l.Index != 1 {
			t.Fatalf("took lane %d at the hint's end, want a probe on lane 1", l.Index)
		}
	})
	// A lone lane is not held: the key's throttler takes the pushback.
	one := newSet(policy.Replicas{Connections: 1})
	if rep := one.Done(one.Take(t0, 0), t0, time.Millisecond, policy.Failure, Answer{Hold: 5 * time.Second}); rep.Held {
		t.Error("a lone lane was held; the key should be")
	}
}

// TestARetryAfterOfALaneThatLeftIsTheKeys: a lane whose address left the
// set is held by nothing, so its last attempt's Retry-After is not
// reported Held, which would drop the key's pushback with no lane held.
func TestARetryAfterOfALaneThatLeftIsTheKeys(t *testing.T) {
	s := addrSet(t, policy.Replicas{ConsecutiveFailures: -1}, "a:1", "b:1", "c:1")
	for _, used := range []uint64{0b110, 0b101, 0b011} {
		s.Done(s.Take(t0, used), t0, time.Millisecond, policy.Success, Answer{})
	}
	a := s.Take(t0, 0b110)
	if a.Addr != "a:1" {
		t.Fatalf("took %q, want a:1", a.Addr)
	}
	s.refreshAt.Store(0)
	s.StartRefresh(t0)
	s.Update(t0, []string{"b:1", "c:1"}, nil)
	if rep := s.Done(a, t0, time.Millisecond, policy.Failure, Answer{Hold: 5 * time.Second}); rep.Held {
		t.Errorf("a 503 with Retry-After on a lane that left the set: %+v, want not held, the key's to take", rep)
	}
}

// TestPushbackEjectsNoLane: a replica that pushes back (503 with
// Retry-After) at every attempt a client sends it in a moment of overload
// is held, probed when its hold may be over, held again, and never
// ejected: counted as failures in a row, its pushback would have every
// client eject it for EjectFor at once, and the replicas left would
// refuse what it served.
func TestPushbackEjectsNoLane(t *testing.T) {
	s := newSet(policy.Replicas{})
	for _, used := range []uint64{0b1110, 0b1011, 0b0111} { // lanes 0, 2 and 3 answered
		s.Done(s.Take(t0, used), t0, time.Millisecond, policy.Success, Answer{})
	}
	now := t0
	for i := range 10 {
		l := s.Take(now, 0b1101)
		if l.Index != 1 {
			t.Fatalf("refusal %d: took lane %d once its hold could be over, want a probe on lane 1", i+1, l.Index)
		}
		rep := s.Done(l, now, time.Millisecond, policy.Failure, Answer{Hold: time.Second, Hint: 20 * time.Millisecond})
		if !rep.Held || len(rep.Ejected) != 0 {
			t.Fatalf("refusal %d: held %v, ejected %+v, want held, none ejected", i+1, rep.Held, rep.Ejected)
		}
		now = now.Add(20 * time.Millisecond)
	}
	if ej := s.Counts(now).Ejected; ej != 0 {
		t.Errorf("%d lanes ejected after 10 refusals with Retry-After in a row, want none", ej)
	}
	// A failure with no Retry-After still counts: the run goes on from
	// zero.
	for i := range 5 {
		rep := s.Done(s.Take(now, 0b1101), now, time.Millisecond, policy.Failure, Answer{})
		if got := len(rep.Ejected) == 1; got != (i == 4) {
			t.Fatalf("failure %d without Retry-After: ejected %+v, want lane 1 at the fifth", i+1, rep.Ejected)
		}
	}
}

func TestRefresh(t *testing.T) {
	s := newSet(policy.Replicas{Endpoints: stub{}, Refresh: 30 * time.Second})
	if l := s.Take(t0, 0); l.Addr != "" || l.Index != 0 {
		t.Fatalf("before any answer took %+v, want the request's own address", l.Pool)
	}
	s.Done(s.view.Load().lanes[0], t0, time.Millisecond, policy.Success, Answer{})
	type step struct {
		at      time.Duration
		start   bool     // StartRefresh's answer
		addrs   []string // Update's answer, if started
		err     error
		lanes   []string // the set's addresses after
		drained int
	}
	boom := errors.New("no answer")
	steps := []step{
		{0, true, nil, boom, []string{""}, 0}, // a failed first answer: ask again after 1 s
		{500 * time.Millisecond, false, nil, nil, []string{""}, 0},
		{time.Second, true, []string{}, nil, []string{""}, 0}, // empty: again after 2 s
		{2 * time.Second, false, nil, nil, []string{""}, 0},
		{3 * time.Second, true, []string{"a:1", "b:1", "a:1", ""}, nil, []string{"a:1", "b:1"}, 1},
		{20 * time.Second, false, nil, nil, []string{"a:1", "b:1"}, 0},
		{33 * time.Second, true, nil, boom, []string{"a:1", "b:1"}, 0},                   // kept; again after 1 s
		{34 * time.Second, true, []string{"c:1", "b:1"}, nil, []string{"c:1", "b:1"}, 1}, // a drained, c in its slot
	}
	for i, st := range steps {
		now := t0.Add(st.at)
		if got := s.StartRefresh(now); got != st.start {
			t.Fatalf("step %d: StartRefresh = %v, want %v", i, got, st.start)
		}
		if st.start {
			if s.StartRefresh(now) {
				t.Fatalf("step %d: a second refresh started while one runs", i)
			}
			if d := s.Update(now, st.addrs, st.err).Drained; len(d) != st.drained {
				t.Fatalf("step %d: %d lanes drained, want %d", i, len(d), st.drained)
			}
		}
		v := s.view.Load()
		var got []string
		for j := range v.n {
			got = append(got, v.lanes[j].Addr)
		}
		if fmt.Sprint(got) != fmt.Sprint(st.lanes) {
			t.Fatalf("step %d: lanes %q, want %q", i, got, st.lanes)
		}
	}
}

func TestALaneLeavingWithAttemptsInFlightDrainsWithTheLast(t *testing.T) {
	s := newSet(policy.Replicas{Endpoints: stub{}})
	s.StartRefresh(t0)
	s.Update(t0, []string{"a:1", "b:1"}, nil)
	a := s.Take(t0, 0b10)
	a2 := s.Take(t0, 0b10)
	if a.Addr != "a:1" || a2.Addr != "a:1" {
		t.Fatalf("took %q and %q, want a:1 twice", a.Addr, a2.Addr)
	}
	s.refreshAt.Store(0)
	s.StartRefresh(t0)
	if d := s.Update(t0, []string{"b:1"}, nil).Drained; len(d) != 0 {
		t.Fatalf("a lane with attempts in flight drained at once: %v", d)
	}
	n := 0
	s.Pools(func(pool) { n++ })
	if n != 2 {
		t.Errorf("Pools reached %d pools, want 2 (b, and a draining)", n)
	}
	if rep := s.Done(a, t0, time.Millisecond, policy.Success, Answer{}); rep.Drained != nil {
		t.Fatal("drained with an attempt still in flight")
	}
	if rep := s.Done(a2, t0, time.Millisecond, policy.Success, Answer{}); rep.Drained != a {
		t.Fatalf("the last attempt's Done drained %v, want lane a", rep.Drained)
	}
	n = 0
	s.Pools(func(pool) { n++ })
	if n != 1 {
		t.Errorf("Pools reached %d pools after the drain, want 1", n)
	}
}

func TestAnswersPastMaxLanesAreCounted(t *testing.T) {
	s := newSet(policy.Replicas{Endpoints: stub{}})
	var addrs []string
	for i := range 70 {
		addrs = append(addrs, fmt.Sprintf("10.0.0.%d:80", i))
	}
	s.StartRefresh(t0)
	s.Update(t0, addrs, nil)
	if c := s.Counts(t0); c.Lanes != 64 || c.Ignored != 6 {
		t.Errorf("Counts: %d lanes, %d ignored, want 64 and 6", c.Lanes, c.Ignored)
	}
}

// TestLanesComeAndGoWhileCallsRun is for the race detector: picks and
// outcomes on every lane while refreshes add and remove them; every lane
// that left is drained exactly when its last attempt ends, or at once.
func TestLanesComeAndGoWhileCallsRun(t *testing.T) {
	s := newSet(policy.Replicas{Endpoints: stub{}})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			var used uint64
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				now := t0.Add(time.Duration(i) * time.Millisecond)
				l := s.Take(now, used)
				used |= 1 << l.Index
				if i%3 == 0 {
					used = 0
				}
				o := policy.Success
				if (i+g)%7 == 0 {
					o = policy.Failure
				}
				s.Done(l, now, time.Millisecond, o, Answer{})
			}
		})
	}
	sets := [][]string{{"a:1", "b:1"}, {"b:1", "c:1", "d:1"}, {"a:1"}, {"e:1", "f:1", "a:1"}}
	for i := range 200 {
		now := t0.Add(time.Duration(i) * time.Minute)
		if s.StartRefresh(now) {
			s.Update(now, sets[i%len(sets)], nil)
		}
	}
	close(stop)
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.draining) != 0 {
		t.Errorf("%d lanes still draining with nothing in flight", len(s.draining))
	}
}

func TestTakeAllocatesNothing(t *testing.T) {
	s := newSet(policy.Replicas{})
	if n := testing.AllocsPerRun(1000, func() {
		l := s.Take(t0, 0b1)
		s.Done(l, t0, time.Millisecond, policy.Success, Answer{})
	}); n != 0 {
		t.Errorf("Take and Done allocate %v times, want 0", n)
	}
}

func BenchmarkTake(b *testing.B) {
	for _, n := range []int{4, 64} {
		b.Run(fmt.Sprint(n, "-lanes"), func(b *testing.B) {
			s := newSet(policy.Replicas{Connections: n})
			now := time.Now()
			for range n * 10 {
				l := s.Take(now, 0)
				s.Done(l, now, time.Millisecond, policy.Success, Answer{})
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l := s.Take(now, 0)
					l.outstanding.Add(-1)
				}
			})
		})
	}
}

func BenchmarkTakeAndDone(b *testing.B) {
	s := newSet(policy.Replicas{})
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		l := s.Take(now, 0)
		s.Done(l, now, time.Millisecond, policy.Success, Answer{})
	}
}

func BenchmarkTakeSerial(b *testing.B) {
	s := newSet(policy.Replicas{})
	now := time.Now()
	for range 40 {
		l := s.Take(now, 0)
		s.Done(l, now, time.Millisecond, policy.Success, Answer{})
	}
	b.ReportAllocs()
	for b.Loop() {
		l := s.Take(now, 0)
		l.outstanding.Add(-1)
	}
}

func TestNth(t *testing.T) {
	for _, m := range []uint64{1, 0b1011, 1 << 63, 0xffffffffffffffff, 0x8000_0001_0000_0100, 0x00ff_0000_ff00_00f0} {
		var want []int
		for i := range 64 {
			if m&(1<<i) != 0 {
				want = append(want, i)
			}
		}
		for k, w := range want {
			if got := nth(m, k); got != w {
				t.Errorf("nth(%#x, %d) = %d, want %d", m, k, got, w)
			}
		}
	}
}

func TestDecayed(t *testing.T) {
	for _, dt := range []time.Duration{-time.Second, 0, 1, time.Millisecond, 499 * time.Millisecond, 500 * time.Millisecond, 501 * time.Millisecond, time.Second, time.Minute} {
		want := math.Exp(-max(float64(dt), 0) / float64(decay))
		if got := decayed(int64(dt)); math.Abs(got-want) > 3e-7*want {
			t.Errorf("decayed(%v) = %v, want %v", dt, got, want)
		}
	}
}

func TestAConnectionLaneFailingAloneIsDialedAnew(t *testing.T) {
	// A connection lane sits on the replicas its connections were placed
	// on: failing in a row while the other lanes succeed, it is placed
	// anew, with a new lane's estimate, and keeps its failures in a row
	// (the key's evidence) until it answers.
	s := newSet(policy.Replicas{})
	for i := 1; i < 4; i++ {
		s.Done(s.Take(t0, 0b1111&^(1<<i)), t0, 2*time.Millisecond, policy.Success, Answer{})
	}
	bad := s.view.Load().lanes[0]
	for i, want := range []bool{false, true, true} {
		l := s.Take(t0, 0b1110)
		rep := s.Done(l, t0, time.Millisecond, policy.Failure, Answer{})
		if got := l.Redial.Load(); got != want {
			t.Errorf("failure %d in a row: Redial %v, want %v", i+1, got, want)
		}
		if rep.Explained != want {
			t.Errorf("failure %d in a row: Explained %v, want %v", i+1, rep.Explained, want)
		}
		if want && bad.est.Load() != 0 {
			t.Errorf("failure %d in a row: the lane dialed anew has estimate %v, want none", i+1, bad.estimate(s.nanos(t0)))
		}
	}
	if bad.consecutive != 3 {
		t.Errorf("%d failures in a row after three, want 3: dialing anew keeps them", bad.consecutive)
	}
	s.Done(s.Take(t0, 0b1110), t0, time.Millisecond, policy.Success, Answer{})
	if bad.Redial.Load() {
		t.Error("Redial still set after the lane succeeded")
	}
	// Placed on the failing replica again and again, it is ejected.
	for range 5 {
		s.Done(s.Take(t0, 0b1110), t0, time.Millisecond, policy.Failure, Answer{})
	}
	if !bad.ejectedAt(s.nanos(t0)) {
		t.Error("not ejected after five failures in a row")
	}

	t.Run("every lane failing", func(t *testing.T) {
		s := newSet(policy.Replicas{ConsecutiveFailures: -1})
		for i := range 4 { // each lane known to fail
			l := s.Take(t0, 0b1111&^(1<<i))
			s.Done(l, t0, time.Millisecond, policy.Failure, Answer{})
			l.Redial.Store(false)
		}
		for range 100 {
			l := s.Take(t0, 0)
			s.Done(l, t0, time.Millisecond, policy.Failure, Answer{})
			if l.Redial.Load() {
				t.Fatalf("lane %d dialed anew with every lane failing: the host fails, not its connections", l.Index)
			}
		}
	})
	t.Run("address lanes", func(t *testing.T) {
		s := newSet(policy.Replicas{Endpoints: stub{}})
		s.StartRefresh(t0)
		s.Update(t0, []string{"a", "b", "c", "d"}, nil)
		for i := 1; i < 4; i++ {
			s.Done(s.Take(t0, 0b1111&^(1<<i)), t0, 2*time.Millisecond, policy.Success, Answer{})
		}
		for range 3 {
			l := s.Take(t0, 0b1110)
			s.Done(l, t0, time.Millisecond, policy.Failure, Answer{})
			if l.Redial.Load() {
				t.Fatal("an address lane dialed anew: its address is its replica")
			}
		}
	})
}

// TestTakeOncePassesOverASilentLane: a lane whose last attempt ended with
// no answer (a hedge leg cut short) is passed over by TakeOnce, for a
// request that cannot be sent twice, until it answers again; TakeOnce
// takes it when no other lane is left.
func TestTakeOncePassesOverASilentLane(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	now := t0
	for range 300 {
		now = now.Add(time.Millisecond)
		s.Done(s.Take(now, 0), now, 5*time.Millisecond, policy.Success, Answer{})
	}
	others := uint64(0)
	for _, l := range s.view.Load().lanes[:3] {
		if l.Addr != "a" {
			others |= 1 << l.Index
		}
	}
	a := s.Take(now, others)                                  // the only lane the call has not used
	s.Done(a, now, 0, policy.Discarded, Answer{Kind: Silent}) // its estimate unchanged
	count := func(take func(time.Time, uint64) *Lane[pool], used uint64) int {
		n := 0
		for range 300 {
			l := take(now, used)
			if l.Addr == "a" {
				n++
			}
			s.Done(l, now, 0, policy.Canceled, Answer{})
		}
		return n
	}
	if n := count(s.TakeOnce, 0); n != 0 {
		t.Errorf("TakeOnce drew the silent lane %d times in 300, want 0", n)
	}
	if n := count(s.TakeOnce, others); n != 300 {
		t.Errorf("TakeOnce drew the silent lane %d times in 300 when the call had used the others, want 300", n)
	}
	s.Done(s.Take(now, others), now, 5*time.Millisecond, policy.Success, Answer{}) // it answers
	if s.silent.Load()&(1<<a.Index) != 0 {
		t.Error("the lane is still silent after it answered")
	}
}

// words returns a random source that yields ws in turn.
func words(ws ...uint64) func() uint64 {
	return func() uint64 {
		w := ws[0]
		ws = append(ws[1:], w)
		return w
	}
}

// draw is the random word that draws the a-th lane of n, then the b-th of
// the n−1 others.
func draw(a, b, n int) uint64 {
	lo := (uint64(a)<<32 + uint64(n) - 1) / uint64(n)
	hi := (uint64(b)<<32 + uint64(n-1) - 1) / uint64(n-1)
	return hi<<32 | lo
}

func TestTakePicksTheCheaperOfTheTwoDrawn(t *testing.T) {
	s := newSet(policy.Replicas{})
	for i := range 4 { // lane i answers in (i+1) ms: lane 0 is the cheapest
		s.rand = words(draw(i, 0, 4))
		l := s.Take(t0, 0)
		s.Done(l, t0, time.Duration(l.Index+1)*time.Millisecond, policy.Success, Answer{})
	}
	for _, tc := range []struct {
		a, b int // the k-th of the candidates, and of the others
		used uint64
		want int
	}{
		{0, 0, 0, 0},      // lanes 0 and 1: 0 is faster
		{3, 0, 0, 0},      // lanes 3 and 0
		{2, 2, 0, 2},      // lanes 2 and 3
		{3, 1, 0, 1},      // lanes 3 and 1
		{0, 0, 0b0001, 1}, // lane 0 used: lanes 1 and 2
		{2, 1, 0b0001, 2}, // lanes 3 and 2
		{1, 0, 0b0011, 2}, // only 2 and 3 left: 3, then 2
	} {
		s.rand = words(draw(tc.a, tc.b, 4-bits.OnesCount64(tc.used)))
		l := s.Take(t0, tc.used)
		l.outstanding.Add(-1)
		if l.Index != tc.want {
			t.Errorf("draw (%d, %d) with %04b used: lane %d, want %d", tc.a, tc.b, tc.used, l.Index, tc.want)
		}
	}
}

func TestUpdateReportsTheChange(t *testing.T) {
	var many []string
	for i := range policy.MaxLanes + 3 {
		many = append(many, "h"+strconv.Itoa(i)+":80")
	}
	// Each answer to a Set with Endpoints, whose one lane dials the
	// request's own address.
	for _, tc := range []struct {
		answer, added []string
	}{
		{nil, nil},
		{[]string{"", ""}, nil},
		{[]string{"b:1", "a:1", "b:1", ""}, []string{"b:1", "a:1"}},
		{append(slices.Clone(many), many[0]), many[:policy.MaxLanes]},
	} {
		s := newSet(policy.Replicas{Endpoints: stub{}})
		c := s.Update(t0, tc.answer, nil)
		if !slices.Equal(c.Added, tc.added) || c.Removed != nil || c.Lanes != len(tc.added) {
			t.Errorf("Update(%q) = added %q, removed %q, %d lanes; want added %q, none removed, %d lanes",
				tc.answer, c.Added, c.Removed, c.Lanes, tc.added, len(tc.added))
		}
	}

	s := newSet(policy.Replicas{Endpoints: stub{}})
	for _, st := range []struct {
		answer         []string
		err            error
		added, removed []string
		lanes, drained int
	}{
		{[]string{"a", "b", "c"}, nil, []string{"a", "b", "c"}, nil, 3, 1},
		{[]string{"c", "d"}, nil, []string{"d"}, []string{"a", "b"}, 2, 2}, // d takes a's slot, 0
		{[]string{"e"}, nil, []string{"e"}, []string{"d", "c"}, 1, 2},      // in the lanes' order
		{nil, errors.New("no answer"), nil, nil, 0, 0},
		{[]string{"e"}, nil, nil, nil, 1, 0},
	} {
		c := s.Update(t0, st.answer, st.err)
		if !slices.Equal(c.Added, st.added) || !slices.Equal(c.Removed, st.removed) || c.Lanes != st.lanes || len(c.Drained) != st.drained {
			t.Errorf("Update(%q, %v) = added %q, removed %q, %d lanes, %d drained; want %q, %q, %d, %d",
				st.answer, st.err, c.Added, c.Removed, c.Lanes, len(c.Drained), st.added, st.removed, st.lanes, st.drained)
		}
	}
}
