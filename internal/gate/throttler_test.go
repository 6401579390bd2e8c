package gate

import (
	"cmp"
	"math"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// thStart is the instant every throttler test starts from.
var thStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// thBook returns cfg with its zero K, Window, MinRequests and MaxRejection
// set to the values the formula's tables below are written for: the book's
// K and window (2, two minutes), a floor of 20 and a ceiling of 0.95.
func thBook(cfg policy.Throttler) policy.Throttler {
	cfg.K = cmp.Or(cfg.K, 2)
	cfg.Window = cmp.Or(cfg.Window, 2*time.Minute)
	cfg.MinRequests = cmp.Or(cfg.MinRequests, 20)
	cfg.MaxRejection = cmp.Or(cfg.MaxRejection, 0.95)
	return cfg
}

// TestThrottlerRejectionProbability steps p through the book's formula with
// explicit instants: a refused attempt is a request at Admit, an admitted
// one at Done, with its accept, and Canceled or Discarded attempts count
// neither way.
func TestThrottlerRejectionProbability(t *testing.T) {
	const unpinned = -1.0
	steps := []struct {
		at     time.Duration
		admits int            // attempts at this instant
		o      policy.Outcome // the admitted ones' outcome
		accept bool           // and whether the backend accepted them
		want   float64        // Pressure after the step, or unpinned
	}{
		{at: 0, admits: 100, o: policy.Success, accept: true, want: 0},
		// Refusals start: p stays 0 until requests exceed K·accepts.
		{at: 10 * time.Second, admits: 100, o: policy.Failure, want: 0},
		{at: 20 * time.Second, admits: 100, o: policy.Failure, want: 100.0 / 301},
		// Throttled attempts still count as requests.
		{at: 25 * time.Second, admits: 300, o: policy.Failure, want: 400.0 / 601},
		// Canceled and Discarded attempts count neither way, accepted or not.
		{at: 26 * time.Second, admits: 50, o: policy.Canceled, want: unpinned},
		{at: 27 * time.Second, admits: 50, o: policy.Discarded, accept: true, want: unpinned},
		// A 500 the backend served is accepted: p comes back down.
		{at: 40 * time.Second, admits: 400, o: policy.Failure, accept: true, want: unpinned},
		// Two minutes and a slice later, everything has slid out.
		{at: 2*time.Minute + 30*time.Second, want: 0},
	}
	th := newThrottler(thBook(policy.Throttler{}), thStart, 1)
	var req, acc, wd float64
	for _, s := range steps {
		now := thStart.Add(s.at)
		for range s.admits {
			req++
			d := th.Admit(now, shedding.Critical, "")
			if !d.OK {
				continue
			}
			th.Done(now, s.o, s.accept, nil)
			switch {
			case !s.o.Evidence():
				wd++
			case s.accept:
				acc++
			}
		}
		want := s.want
		if want == unpinned {
			want = math.Max(0, (req-wd-2*acc)/(req-wd+1))
		}
		if got := th.Pressure(now); math.Abs(got-want) > 1e-12 {
			t.Errorf("at %v: Pressure = %v, want %v (requests %v, withdrawn %v, accepts %v)", s.at, got, want, req, wd, acc)
		}
	}
}

// TestThrottlerFreshHost: one refusal from a host the throttler has just
// met is not evidence of overload. The book's formula alone gives
// 1/(1+1) = 0.5 here, so half the next attempts would never leave the
// process.
func TestThrottlerFreshHost(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	if d := th.Admit(thStart, shedding.Critical, ""); !d.OK {
		t.Fatal("the first attempt was refused")
	}
	th.Done(thStart, policy.Failure, false, nil) // a 503
	if got := th.Pressure(thStart); got != 0 {
		t.Errorf("after one 503 on a fresh host: Pressure = %v, want 0", got)
	}
	for i := range 10 {
		if d := th.Admit(thStart, shedding.Bulk, ""); !d.OK || d.Pressure != 0 {
			t.Fatalf("attempt %d after one 503: %+v, want admitted at pressure 0", i+2, d)
		}
	}
}

// thStep is a step of the floor and ceiling tables: at an instant, some
// attempts withdrawn (Canceled), then some accepted, then some refused by
// the backend, and the rejection probability wanted afterwards.
type thStep struct {
	at                           time.Duration
	withdrawn, accepts, failures int
	want                         float64
}

// TestThrottlerFloor steps the MinRequests floor: p is 0 while the window
// holds fewer than MinRequests requests (withdrawn ones do not count), and
// the book's formula from MinRequests on. Pressure must agree with the
// table after each step, and the next Admit's Pressure after the last.
func TestThrottlerFloor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   policy.Throttler
		steps []thStep
	}{
		{"fresh host, one refusal", policy.Throttler{}, []thStep{
			{failures: 1, want: 0},
		}},
		{"a floor of 20: 19 requests, then 20", policy.Throttler{}, []thStep{
			{accepts: 3, failures: 16, want: 0}, // the formula alone: 13/20
			{at: time.Second, failures: 1, want: 14.0 / 21},
		}},
		{"MinRequests 5: 4 refusals, then 5", policy.Throttler{MinRequests: 5}, []thStep{
			{failures: 4, want: 0},
			{at: time.Second, failures: 1, want: 5.0 / 6},
		}},
		{"withdrawn attempts do not count toward the floor", policy.Throttler{}, []thStep{
			{withdrawn: 10, accepts: 3, failures: 16, want: 0},
			{at: time.Second, failures: 1, want: 14.0 / 21},
		}},
		{"enough accepts: no pressure past the floor", policy.Throttler{}, []thStep{
			{accepts: 50, failures: 50, want: 0},
		}},
		{"the floor applies again once the window has emptied", policy.Throttler{MinRequests: 5}, []thStep{
			{failures: 5, want: 5.0 / 6},
			{at: 2*time.Minute + 30*time.Second, failures: 1, want: 0},
		}},
		{"negative MinRequests: no floor, the book's formula", policy.Throttler{MinRequests: -1}, []thStep{
			{failures: 1, want: 1.0 / 2},
			{at: time.Second, failures: 1, want: 2.0 / 3},
		}},
		{"MinRequests 1: the book's formula too", policy.Throttler{MinRequests: 1}, []thStep{
			{failures: 1, want: 1.0 / 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			thRunSteps(t, tc.cfg, tc.steps)
		})
	}
}

// TestThrottlerCeiling steps the MaxRejection ceiling: however many
// refusals, p stops at MaxRejection; below it the formula is untouched.
func TestThrottlerCeiling(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   policy.Throttler
		steps []thStep
	}{
		{"all refusals, at the floor: capped at 0.95", policy.Throttler{}, []thStep{
			{failures: 19, want: 0},
			{at: time.Second, failures: 1, want: 0.95}, // the formula alone: 20/21
		}},
		{"all refusals, many", policy.Throttler{}, []thStep{
			{failures: 1000, want: 0.95},
			{at: time.Minute, failures: 1000, want: 0.95},
		}},
		{"below the ceiling, the formula", policy.Throttler{}, []thStep{
			{accepts: 3, failures: 17, want: 14.0 / 21},
		}},
		{"a lower ceiling", policy.Throttler{MaxRejection: 0.5}, []thStep{
			{accepts: 3, failures: 17, want: 0.5}, // the formula alone: 14/21
		}},
		{"MaxRejection 1: the book's formula", policy.Throttler{MaxRejection: 1}, []thStep{
			{failures: 1000, want: 1000.0 / 1001},
		}},
		{"no floor and no ceiling", policy.Throttler{MinRequests: -1, MaxRejection: 1}, []thStep{
			{failures: 1, want: 1.0 / 2},
			{at: time.Second, failures: 99, want: 100.0 / 101},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			thRunSteps(t, tc.cfg, tc.steps)
		})
	}
}

// TestThrottlerCeilingSplit: a backend that refuses everything, under a
// ceiling of 0.95. p stops there and the split keeps the share refused
// there: with Critical alone, about 1 attempt in 20 goes through; with
// Critical and Bulk half and half, Bulk is refused outright and Critical
// takes the rest, q = (0.95·2 − 1)/1 = 0.9, so about 1 in 10 goes through.
func TestThrottlerCeilingSplit(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		isBulk                 func(i int) bool
		wantCritical, wantBulk float64 // admitted rates
	}{
		{"critical only", func(int) bool { return false }, 0.05, 0},
		{"half bulk", func(i int) bool { return i%2 == 1 }, 0.10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 40 s of 100 attempts every 100 ms, every one refused by the
			// backend; p is at the ceiling from the 21st attempt on, and
			// the last 30 s are tallied.
			th := newThrottler(thBook(policy.Throttler{}), thStart, 13)
			var tally [shedding.NumPriorities]thTally
			for tick := range 400 {
				now := thStart.Add(time.Duration(tick) * 100 * time.Millisecond)
				for i := range 100 {
					prio := shedding.Critical
					if tc.isBulk(i) {
						prio = shedding.Bulk
					}
					d := th.Admit(now, prio, "")
					if d.OK {
						th.Done(now, policy.Failure, false, nil)
					}
					if tick >= 100 {
						tally[prio].sent++
						if d.OK {
							tally[prio].admitted++
						}
					}
				}
			}
			if p := th.Pressure(thStart.Add(40 * time.Second)); p != 0.95 {
				t.Errorf("Pressure = %v, want the ceiling, 0.95", p)
			}
			if got := tally[shedding.Critical].rate(); math.Abs(got-tc.wantCritical) > 0.01 {
				t.Errorf("Critical admitted at %.4f, want about %v", got, tc.wantCritical)
			}
			if c := tally[shedding.Bulk]; c.admitted != 0 {
				t.Errorf("Bulk: %d of %d admitted, want none", c.admitted, c.sent)
			}
			t.Logf("admitted: critical %.4f", tally[shedding.Critical].rate())
		})
	}
}

// thRunSteps drives a fresh throttler of cfg through steps, Critical
// attempts with no tenant, and checks Pressure after each step and, after
// the last, the Pressure the next Admit decides at.
func thRunSteps(t *testing.T, cfg policy.Throttler, steps []thStep) {
	t.Helper()
	th := newThrottler(thBook(cfg), thStart, 1)
	admit := func(now time.Time, o policy.Outcome, accepted bool) {
		if d := th.Admit(now, shedding.Critical, ""); d.OK {
			th.Done(now, o, accepted, nil)
		} else if o != policy.Failure {
			t.Fatalf("an attempt meant to be %v was refused: the table is wrong", o)
		}
	}
	for _, s := range steps {
		now := thStart.Add(s.at)
		for range s.withdrawn {
			admit(now, policy.Canceled, false)
		}
		for range s.accepts {
			admit(now, policy.Success, true)
		}
		for range s.failures {
			admit(now, policy.Failure, false)
		}
		if got := th.Pressure(now); math.Abs(got-s.want) > 1e-12 {
			t.Errorf("at %v: Pressure = %v, want %v", s.at, got, s.want)
		}
	}
	last := steps[len(steps)-1]
	if d := th.Admit(thStart.Add(last.at), shedding.Critical, ""); math.Abs(d.Pressure-last.want) > 1e-12 {
		t.Errorf("at %v: the next Admit decided at Pressure %v, want %v", last.at, d.Pressure, last.want)
	}
}

// TestThrottlerK: a larger K tolerates more refusals before throttling.
func TestThrottlerK(t *testing.T) {
	th := newThrottler(policy.Throttler{K: 4, Window: time.Minute}, thStart, 1)
	for i := range 100 {
		th.Admit(thStart, shedding.Critical, "")
		th.Done(thStart, policy.Success, i < 25, nil)
	}
	if got := th.Pressure(thStart); got != 0 {
		t.Errorf("K=4, a quarter accepted: Pressure = %v, want 0", got)
	}
	th.Admit(thStart, shedding.Critical, "")
	if got := th.Pressure(thStart); got != 0 {
		t.Errorf("one more request on its way: Pressure = %v, want 0 (no evidence yet)", got)
	}
	th.Done(thStart, policy.Failure, false, nil)
	if got, want := th.Pressure(thStart), 1.0/102; math.Abs(got-want) > 1e-12 {
		t.Errorf("one more request, refused: Pressure = %v, want %v", got, want)
	}
}

// thBackend is a backend that accepts at most capacity attempts per tick
// and refuses the rest, as a server shedding at its limit does.
type thBackend struct {
	capacity, used int
}

func (b *thBackend) serve() bool {
	b.used++
	return b.used <= b.capacity
}

// thTally counts decisions per class.
type thTally struct{ sent, admitted int }

func (c thTally) rate() float64 { return float64(c.admitted) / float64(c.sent) }

// thDrive runs 300 s of traffic, 100 requests every 100 ms, request i Bulk
// when bulk(i) and Critical otherwise, against a backend that accepts
// capacity requests a tick, and tallies the second half per priority.
func thDrive(th *Throttler, capacity int, bulk func(i int) bool) [shedding.NumPriorities]thTally {
	var tally [shedding.NumPriorities]thTally
	for tick := range 3000 {
		now := thStart.Add(time.Duration(tick) * 100 * time.Millisecond)
		be := thBackend{capacity: capacity}
		for i := range 100 {
			prio := shedding.Critical
			if bulk(i) {
				prio = shedding.Bulk
			}
			d := th.Admit(now, prio, "")
			if tick >= 1500 {
				tally[prio].sent++
				if d.OK {
					tally[prio].admitted++
				}
			}
			if d.OK {
				th.Done(now, policy.Success, be.serve(), nil)
			}
		}
	}
	return tally
}

// TestThrottlerShedsBulkFirst: half the traffic Critical, half Bulk, and a
// backend that accepts 35% of it. p settles near 1 − 2·0.35 = 0.3, all of
// it taken from Bulk: Critical is never refused.
func TestThrottlerShedsBulkFirst(t *testing.T) {
	th := newThrottler(thBook(policy.Throttler{}), thStart, 7)
	tally := thDrive(th, 35, func(i int) bool { return i%2 == 1 })
	p := th.Pressure(thStart.Add(300 * time.Second))
	if p < 0.2 || p > 0.4 {
		t.Errorf("Pressure = %v, want about 0.3", p)
	}
	if c := tally[shedding.Critical]; c.admitted != c.sent {
		t.Errorf("Critical: %d of %d admitted, want all while Bulk is sheddable", c.admitted, c.sent)
	}
	if got := tally[shedding.Bulk].rate(); got > 0.55 {
		t.Errorf("Bulk admitted at %.3f, want it to absorb the shedding (about 0.4)", got)
	}
	t.Logf("p %.3f; admitted: critical %.3f, bulk %.3f", p, tally[shedding.Critical].rate(), tally[shedding.Bulk].rate())
}

// TestThrottlerCriticalShedOnlyWhenLowerExhausted: when the backend accepts
// so little that shedding all of Bulk is not enough, Critical is shed too,
// and Bulk is then refused outright.
func TestThrottlerCriticalShedOnlyWhenLowerExhausted(t *testing.T) {
	th := newThrottler(thBook(policy.Throttler{}), thStart, 9)
	tally := thDrive(th, 10, func(i int) bool { return i%4 == 3 })
	if got := tally[shedding.Bulk].admitted; got != 0 {
		t.Errorf("Bulk: %d admitted while Critical was being shed, want 0", got)
	}
	if got := tally[shedding.Critical].rate(); got > 0.5 || got < 0.1 {
		t.Errorf("Critical admitted at %.3f, want about 0.2/0.75", got)
	}
}

// TestHeavyTenantShedBeforeLight is acceptance criterion 7 at the
// throttler: one priority, tenant heavy at ten times tenant light, and a
// backend that accepts about a third of the traffic. The light tenant keeps
// at least 95% of its attempts; the heavy one absorbs the shedding.
func TestHeavyTenantShedBeforeLight(t *testing.T) {
	th := newThrottler(thBook(policy.Throttler{}), thStart, 11)
	var heavy, light thTally
	for tick := range 3000 {
		now := thStart.Add(time.Duration(tick) * 100 * time.Millisecond)
		be := thBackend{capacity: 4}
		for i := range 11 {
			id := "heavy"
			if i == 5 {
				id = "light"
			}
			d := th.Admit(now, shedding.Degraded, id)
			if tick >= 1500 {
				c := &heavy
				if id == "light" {
					c = &light
				}
				c.sent++
				if d.OK {
					c.admitted++
				}
				if d.HeavyTenant != (id == "heavy") && d.Pressure > 0 {
					t.Fatalf("tick %d: %s reported HeavyTenant=%v", tick, id, d.HeavyTenant)
				}
			}
			if d.OK {
				th.Done(now, policy.Success, be.serve(), nil)
			}
		}
	}
	p := th.Pressure(thStart.Add(300 * time.Second))
	if p < 0.15 {
		t.Fatalf("Pressure = %v: the test needs the throttler to be shedding", p)
	}
	if got := light.rate(); got < 0.95 {
		t.Errorf("light tenant admitted at %.3f, want >= 0.95", got)
	}
	// The bucket's expected shed rate is kept: what light is spared, heavy
	// pays.
	shed := 1 - float64(heavy.admitted+light.admitted)/float64(heavy.sent+light.sent)
	if math.Abs(shed-p) > 0.1 {
		t.Errorf("shed %.3f of the traffic, want about p = %.3f", shed, p)
	}
	if got := heavy.rate(); got > 1-p {
		t.Errorf("heavy tenant admitted at %.3f, want below 1 − p = %.3f", got, 1-p)
	}
	t.Logf("p %.3f; admitted: heavy %.3f, light %.3f", p, heavy.rate(), light.rate())
}

// TestThrottlerDeterministic: the same seed and instants give the same
// decisions.
func TestThrottlerDeterministic(t *testing.T) {
	run := func() []bool {
		th := newThrottler(policy.Throttler{}, thStart, 42)
		var got []bool
		for i := range 2000 {
			now := thStart.Add(time.Duration(i) * time.Millisecond)
			d := th.Admit(now, shedding.Priority(i%4), "t"+string(rune('a'+i%3)))
			got = append(got, d.OK)
			if d.OK {
				th.Done(now, policy.Success, i%3 == 0, nil)
			}
		}
		return got
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("decision %d differs between runs", i)
		}
	}
}

func TestThrottlerDoesNotAllocate(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	// Under pressure, with tenants: the slow path.
	for i := range 1000 {
		th.Admit(thStart, shedding.BestEffort, "acme")
		th.Done(thStart, policy.Success, i%4 == 0, nil)
	}
	if th.Pressure(thStart) == 0 {
		t.Fatal("no pressure")
	}
	tenants := []string{"acme", "globex", "initech"}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		d := th.Admit(thStart, shedding.Priority(i%4), tenants[i%3])
		if d.OK {
			th.Done(thStart, policy.Success, i%4 == 0, nil)
		}
		i++
	}); n != 0 {
		t.Errorf("Admit and Done allocate %v times, want 0", n)
	}
}

func TestNilThrottler(t *testing.T) {
	var th *Throttler
	if d := th.Admit(thStart, shedding.Bulk, "x"); !d.OK {
		t.Error("nil throttler refused")
	}
	th.Done(thStart, policy.Failure, false, nil)
	if th.Pressure(thStart) != 0 {
		t.Error("nil throttler has pressure")
	}
}
