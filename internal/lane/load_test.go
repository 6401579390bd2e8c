package lane

import (
	"cmp"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestALoadReportIsKeptWithItsAge: a lane keeps its server's last report
// with its age; a failure bounds it to 1 until a report comes after it.
func TestALoadReportIsKeptWithItsAge(t *testing.T) {
	s := newSet(policy.Replicas{Connections: 1})
	load := func(at time.Time) policy.LaneSnapshot {
		var ls [policy.MaxLanes]policy.LaneSnapshot
		s.States(at, &ls)
		return ls[0]
	}
	if l := load(t0); l.HasLoad || l.Load != 0 || l.LoadAge != 0 {
		t.Errorf("no report yet: %+v", l)
	}
	l := s.Take(t0, 0)
	s.Done(l, t0.Add(time.Second), time.Second, policy.Success, Answer{Load: Load{Util: 0.3}, Reported: true})
	for _, tc := range []struct {
		at  time.Duration
		age time.Duration
	}{
		{time.Second, 0},
		{time.Minute, time.Minute - time.Second},
		{0, 0}, // a clock read before the report: no negative age
	} {
		if l := load(t0.Add(tc.at)); !l.HasLoad || l.Load != 0.3 || l.LoadAge != tc.age {
			t.Errorf("at %v: %+v; want load 0.3, age %v", tc.at, l, tc.age)
		}
	}
	l = s.Take(t0, 0)
	s.Done(l, t0.Add(2*time.Second), time.Second, policy.Failure, Answer{})
	if l := load(t0.Add(2 * time.Second)); l.Load != 1 {
		t.Errorf("after a failure: %+v; want load 1", l)
	}
	l = s.Take(t0, 0)
	s.Done(l, t0.Add(3*time.Second), time.Second, policy.Failure, Answer{Load: Load{Util: 0.1}, Reported: true})
	if l := load(t0.Add(3 * time.Second)); l.Load != 1 {
		t.Errorf("a failed answer's own report: %+v; want load 1", l)
	}
	l = s.Take(t0, 0)
	s.Done(l, t0.Add(4*time.Second), time.Second, policy.Success, Answer{Load: Load{Util: 0.2}, Reported: true})
	if l := load(t0.Add(4 * time.Second)); l.Load != 0.2 {
		t.Errorf("a report after the failure: %+v; want load 0.2", l)
	}
}

// TestALoadReportRaisesACostNeverLowersIt: a fresh report that leaves
// the attempt no room under the server's limit multiplies the lane's cost
// by its utilization, less the queue drained since at one limit per
// latency estimate (down to the limit), with the client's attempts sent
// since and the attempt's own added at Per each; with room, stale, or
// with LoadReportAge negative, the cost is the client's own.
func TestALoadReportRaisesACostNeverLowersIt(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name   string
		age    time.Duration // LoadReportAge
		lat    time.Duration // the lane's latency, its estimate; 0: 10 ms
		load   Load
		fail   bool          // the attempt that brought the report failed
		since  int           // attempts taken after the report, outstanding
		readAt time.Duration // after the report
		want   float64       // the cost as a multiple of the client's own
	}{
		{name: "idle", load: Load{Util: 0}, want: 1},
		{name: "its own attempt fills the limit", load: Load{Util: 0.75, Per: 0.25}, want: 1},
		{name: "at the limit", load: Load{Util: 1, Per: 0.25}, want: 1.25},
		{name: "at the limit with the answered request", load: Load{Util: 1, Per: 0.25, Served: true}, want: 1},
		{name: "a queue of one with the answered request", load: Load{Util: 1.5, Per: 0.25, Served: true}, want: 1.5},
		{name: "a queue of half the limit", load: Load{Util: 1.5, Per: 0.25}, want: 1.75},
		{name: "half drained", load: Load{Util: 1.5, Per: 0.25}, readAt: 2500 * time.Microsecond, want: 1.75 - 0.25/decayed(int64(2500*time.Microsecond))},
		{name: "drained", load: Load{Util: 1.5, Per: 0.25}, readAt: 6 * ms, want: 1.25},
		{name: "two sent since", load: Load{Util: 1, Per: 0.25}, since: 2, want: 1.75},
		{name: "two sent since, no limit said", load: Load{Util: 1}, since: 2, want: 1},
		{name: "under the limit with two sent since", load: Load{Util: 0.25, Per: 0.25}, since: 2, want: 1},
		{name: "fresh to its age", lat: 10 * time.Second, load: Load{Util: 3}, readAt: 2 * time.Second, want: 3 - 0.2/decayed(int64(2*time.Second))},
		{name: "stale", lat: 10 * time.Second, load: Load{Util: 3}, readAt: 2*time.Second + 1, want: 1},
		{name: "a longer age", age: 5 * time.Second, lat: 10 * time.Second, load: Load{Util: 3}, readAt: 4 * time.Second, want: 3 - 0.4/decayed(int64(4*time.Second))},
		{name: "off", age: -1, load: Load{Util: 3}, want: 1},
		{name: "failed", load: Load{Util: 0}, fail: true, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSet(policy.Replicas{Connections: 1, LoadReportAge: tc.age})
			lat := cmp.Or(tc.lat, 10*ms)
			l := s.Take(t0, 0)
			s.Done(l, t0, lat, policy.Success, Answer{})
			o := policy.Success
			if tc.fail {
				o = policy.Failure
			}
			l = s.Take(t0, 0)
			s.Done(l, t0, lat, o, Answer{Load: tc.load, Reported: true})
			for range tc.since {
				s.Take(t0, 0)
			}
			at := s.nanos(t0.Add(tc.readAt))
			own := l.ownCost(at, float64(l.outstanding.Load()), max(l.estimate(at), minEstimate))
			if got := l.cost(at, s.reportAge, s.ends.Load()) / own; math.Abs(got-tc.want) > 1e-9*tc.want {
				t.Errorf("cost %v × the client's own, want %v", got, tc.want)
			}
		})
	}
}

// TestPicksUnderTheLimitAreTodays: with the same random source, lanes
// whose servers report loads at or under their limits are picked exactly
// as lanes with no report; so are lanes reporting loads above it with
// LoadReportAge negative.
func TestPicksUnderTheLimitAreTodays(t *testing.T) {
	run := func(cfg policy.Replicas, report func(i, n int) (Load, bool)) []int {
		s := newSet(cfg)
		s.rand = rand.New(rand.NewPCG(1, 2)).Uint64
		now := t0
		var got []int
		var out []*Lane[pool]
		for n := range 4000 {
			now = now.Add(100 * time.Microsecond)
			l := s.Take(now, 0)
			got = append(got, l.Index)
			out = append(out, l)
			if len(out) < 8 { // eight in flight
				continue
			}
			d := out[0]
			out = out[1:]
			ld, ok := report(d.Index, n)
			s.Done(d, now, time.Duration(d.Index+1)*time.Millisecond+time.Duration(n%7)*100*time.Microsecond, policy.Success, Answer{Load: ld, Reported: ok})
		}
		return got
	}
	none := run(policy.Replicas{}, func(int, int) (Load, bool) { return Load{}, false })
	under := run(policy.Replicas{}, func(i, n int) (Load, bool) {
		return Load{Util: float64((i+n)%5) / 10, Per: 0.05}, true
	})
	off := run(policy.Replicas{LoadReportAge: -1}, func(i, n int) (Load, bool) {
		return Load{Util: float64(i + n%3), Per: 0.1}, true
	})
	for k := range none {
		if under[k] != none[k] || off[k] != none[k] {
			t.Fatalf("pick %d: lane %d with no reports, %d with reports under the limit, %d with reports off", k, none[k], under[k], off[k])
		}
	}
}

// TestALaneOverItsLimitIsAvoided: of four lanes that answer alike, the
// one whose server reports a queue as long as its limit gets a small
// share of the picks while its report is fresh, and its share again once
// its reports stop and the last grows stale.
func TestALaneOverItsLimitIsAvoided(t *testing.T) {
	s := newSet(policy.Replicas{})
	s.rand = rand.New(rand.NewPCG(3, 4)).Uint64
	now := t0
	share := func(n int, reports bool) int {
		hot := 0
		for range n {
			now = now.Add(time.Millisecond)
			l := s.Take(now, 0)
			var a Answer
			if l.Index == 3 {
				hot++
				a = Answer{Load: Load{Util: 5, Per: 0.1}, Reported: reports}
			}
			s.Done(l, now, 10*time.Millisecond, policy.Success, a)
		}
		return hot
	}
	share(4000, false) // every lane warm
	if hot := share(4000, true); hot > 4000/10 {
		t.Errorf("the lane reporting a load of 5 got %d of 4000 picks, want under 10%%", hot)
	}
	now = now.Add(3 * time.Second)
	if hot := share(4000, false); hot < 4000/5 {
		t.Errorf("with its last report stale, the lane got %d of 4000 picks, want about a quarter", hot)
	}
}

// TestAQueueFoundWidensThePick: when the lane the two choices pick would
// queue the attempt (its fresh report says so), the pick is the cheapest
// of every lane it may take; the two choices alone would leave the lane
// that does not queue the half of the picks in which it is drawn. The
// lanes the call used are still passed over, and with LoadReportAge
// negative the two choices rule.
func TestAQueueFoundWidensThePick(t *testing.T) {
	for _, tc := range []struct {
		name      string
		age       time.Duration
		hot, cold Load // lanes 0 to 2's reports, and lane 3's
		used      uint64
		min, max  int // lane 3's picks of 1000
	}{
		{name: "one lane under its limit", hot: Load{Util: 2, Per: 0.25}, cold: Load{Util: 0.5, Per: 0.25}, min: 1000, max: 1000},
		{name: "one lane with the shortest queue", hot: Load{Util: 3, Per: 0.25}, cold: Load{Util: 1.5, Per: 0.25}, min: 1000, max: 1000},
		{name: "the cheapest used", hot: Load{Util: 2, Per: 0.25}, cold: Load{Util: 0.5, Per: 0.25}, used: 1 << 3, min: 0, max: 0},
		{name: "off", age: -1, hot: Load{Util: 2, Per: 0.25}, cold: Load{Util: 0.5, Per: 0.25}, min: 150, max: 350},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSet(policy.Replicas{LoadReportAge: tc.age})
			s.rand = rand.New(rand.NewPCG(5, 6)).Uint64
			report := func(l *Lane[pool]) Answer {
				if l.Index == 3 {
					return Answer{Load: tc.cold, Reported: true}
				}
				return Answer{Load: tc.hot, Reported: true}
			}
			for range 400 { // every lane warm, with its report
				l := s.Take(t0, 0)
				s.Done(l, t0, 10*time.Millisecond, policy.Success, report(l))
			}
			got := 0
			for range 1000 { // at the reports' instant: nothing drained
				l := s.Take(t0, tc.used)
				if l.Index == 3 {
					got++
				}
				s.Done(l, t0, 10*time.Millisecond, policy.Success, Answer{})
			}
			if got < tc.min || got > tc.max {
				t.Errorf("lane 3 got %d of 1000 picks, want %d to %d", got, tc.min, tc.max)
			}
		})
	}
}

// TestALaneAtItsLimitCostsTheAttemptsWait: a lane whose server is at its
// limit costs the wait the attempt itself would have there, its own place
// in the queue: of four lanes, three that answer in 10 ms at their
// servers' limits (a limit of 4) take an attempt 12.5 ms, its service and
// a quarter of one waiting for a slot, so a lane of 12 ms with room gets
// every pick, and one of 13 ms none.
func TestALaneAtItsLimitCostsTheAttemptsWait(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		lat      time.Duration // lane 3's
		min, max int           // its picks of 1000
	}{
		{lat: 12 * ms, min: 1000, max: 1000},
		{lat: 13 * ms, min: 0, max: 0},
	} {
		t.Run(tc.lat.String(), func(t *testing.T) {
			s := newSet(policy.Replicas{})
			s.rand = rand.New(rand.NewPCG(7, 8)).Uint64
			answer := func(l *Lane[pool], reported bool) (time.Duration, Answer) {
				if l.Index == 3 {
					return tc.lat, Answer{Load: Load{Util: 0.5, Per: 0.25}, Reported: reported}
				}
				return 10 * ms, Answer{Load: Load{Util: 1, Per: 0.25}, Reported: reported}
			}
			for range 400 { // every lane warm, with its report
				l := s.Take(t0, 0)
				lat, a := answer(l, true)
				s.Done(l, t0, lat, policy.Success, a)
			}
			got := 0
			for range 1000 { // at the reports' instant: nothing drained
				l := s.Take(t0, 0)
				if l.Index == 3 {
					got++
				}
				lat, a := answer(l, false)
				s.Done(l, t0, lat, policy.Success, a)
			}
			if got < tc.min || got > tc.max {
				t.Errorf("lane 3 got %d of 1000 picks, want %d to %d", got, tc.min, tc.max)
			}
		})
	}
}

// TestALaneQueuesWhenItsReportSaysSo: an attempt would queue when the
// server's utilization, drained down to the limit and compensated (see
// util), and the attempt's own share come to more than 1, by a fresh
// report only.
func TestALaneQueuesWhenItsReportSaysSo(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name   string
		age    time.Duration // LoadReportAge
		load   Load
		since  int           // attempts taken after the report, outstanding
		readAt time.Duration // after the report
		want   bool
	}{
		{name: "none"},
		{name: "its own attempt fills the limit", load: Load{Util: 0.75, Per: 0.25}},
		{name: "its own attempt would wait", load: Load{Util: 1, Per: 0.25}, want: true},
		{name: "the answered request gone, its own attempt fills the limit", load: Load{Util: 1, Per: 0.25, Served: true}},
		{name: "the answered request gone, its own attempt would wait", load: Load{Util: 1.25, Per: 0.25, Served: true}, want: true},
		{name: "one sent since", load: Load{Util: 0.75, Per: 0.25}, since: 1, want: true},
		{name: "drained to the limit", load: Load{Util: 1.5, Per: 0.25}, readAt: 8 * ms, want: true},
		{name: "drained to the limit, no limit said", load: Load{Util: 1.5}, readAt: 8 * ms},
		{name: "at the limit, long after", load: Load{Util: 1, Per: 0.25}, readAt: time.Second, want: true},
		{name: "under the limit, long after", load: Load{Util: 0.5, Per: 0.25}, readAt: time.Second},
		{name: "no limit said, at 1", load: Load{Util: 1}},
		{name: "no limit said, above 1", load: Load{Util: 1.25}, want: true},
		{name: "stale", load: Load{Util: 3, Per: 0.25}, readAt: 2*time.Second + 1},
		{name: "off", age: -1, load: Load{Util: 3, Per: 0.25}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSet(policy.Replicas{Connections: 1, LoadReportAge: tc.age})
			l := s.Take(t0, 0)
			s.Done(l, t0, 10*ms, policy.Success, Answer{})
			l = s.Take(t0, 0)
			s.Done(l, t0, 10*ms, policy.Success, Answer{Load: tc.load, Reported: tc.load != Load{}})
			for range tc.since {
				s.Take(t0, 0)
			}
			if got := l.queues(s.nanos(t0.Add(tc.readAt)), s.reportAge); got != tc.want {
				t.Errorf("queues %v, want %v", got, tc.want)
			}
		})
	}
}
