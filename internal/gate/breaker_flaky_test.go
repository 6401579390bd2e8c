package gate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// A flaky host is not a dead one: the tests of the run rule, the
// confidence the rates are judged with, the baseline learned from slices,
// and recovery as a backoff.

func TestBreakerRunLength(t *testing.T) {
	for _, tt := range []struct {
		p    float64
		want int
	}{
		{0, 5}, {0.01, 5}, {0.05, 5}, {breakerRunPrior, 5}, {0.1, 6},
		{0.2, 9}, {0.35, 14}, {0.5, 20}, {1, breakerRunMax}, {math.NaN(), breakerRunMax},
	} {
		if got := runLength(tt.p); got != tt.want {
			t.Errorf("runLength(%v) = %d, want %d", tt.p, got, tt.want)
		}
		if tt.p > 0 && tt.p < 1 && tt.want > breakerRunMin {
			// The run is the shortest one at most once in a million.
			if math.Pow(tt.p, float64(tt.want)) > breakerRunOdds*(1+1e-9) || math.Pow(tt.p, float64(tt.want-1)) <= breakerRunOdds {
				t.Errorf("runLength(%v) = %d is not the shortest run with p^k <= 1e-6", tt.p, tt.want)
			}
		}
	}
}

// flaky drives b with n calls failing at rate p (seeded), one every
// `every` from `from`, and returns the index of the call that tripped it,
// or -1.
func flaky(b *Breaker, from time.Time, every time.Duration, n int, p float64, rng *rand.Rand) int {
	for i := range n {
		now := from.Add(time.Duration(i) * every)
		perm, d := b.Allow(now)
		if !d.OK {
			return i
		}
		o := policy.Success
		if rng.Float64() < p {
			o = policy.Failure
		}
		if c := b.Done(now, perm, o); c.Changed() {
			return i
		}
	}
	return -1
}

// TestBreakerFlakyHostNeverTrips drives the zero Breaker with 3000 calls of
// a host failing a steady 20% or 35% at random, over 100 seeds, with a
// call every 10ms (30s: the baseline is learned) and with every call at
// one instant (never a baseline: the window's own rate stands in). The one
// way left for such a host to trip is its first five calls failing before
// anything else is known (0.35⁵ = 0.5%, 0.2⁵ = 0.03%), when it is
// indistinguishable from a dead host; anything more is a defect.
func TestBreakerFlakyHostNeverTrips(t *testing.T) {
	const seeds = 100
	for _, p := range []float64{0.2, 0.35} {
		for _, every := range []time.Duration{10 * time.Millisecond, 0} {
			trips, early := 0, 0
			for seed := range uint64(seeds) {
				b := newBreaker(policy.Breaker{}, bkStart, seed)
				rng := rand.New(rand.NewPCG(seed, 35))
				if at := flaky(b, bkStart, every, 3000, p, rng); at >= 0 {
					trips++
					if at < 5 {
						early++
					}
				}
			}
			t.Logf("p %.2f, every %v: %d of %d seeds tripped, %d of them on their first five calls", p, every, trips, seeds, early)
			if late := trips - early; late > 0 {
				t.Errorf("p %.2f, every %v: %d of %d seeds tripped after their first five calls", p, every, late, seeds)
			}
			if want := int(math.Ceil(2 * seeds * math.Pow(p, 5))); early > want {
				t.Errorf("p %.2f, every %v: %d of %d seeds tripped on their first five calls, want at most %d (twice seeds·p⁵)", p, every, early, seeds, want)
			}
		}
	}
	// The case as it was reported: one host at 35%, 3000 calls.
	b := newBreaker(policy.Breaker{}, bkStart, 1)
	if at := flaky(b, bkStart, time.Millisecond, 3000, 0.35, rand.New(rand.NewPCG(1, 2))); at >= 0 {
		t.Fatalf("a host failing 35%% tripped at call %d", at)
	}
}

// learned returns a breaker that has learned a 5% baseline from 30s of
// calls at 200 a second.
func learned(t *testing.T, seed uint64, rng *rand.Rand) (*Breaker, time.Time) {
	t.Helper()
	const every = 5 * time.Millisecond
	b := newBreaker(policy.Breaker{}, bkStart, seed)
	if at := flaky(b, bkStart, every, 6000, 0.05, rng); at >= 0 {
		t.Fatalf("seed %d: the 5%% phase tripped at call %d", seed, at)
	}
	now := bkStart.Add(6000 * every)
	if r := b.Rate(now); !r.BaselineKnown || math.Abs(r.Baseline-0.05) > 0.02 {
		t.Fatalf("seed %d: after 30s at 5%%: Rate = %+v, want a baseline near 0.05", seed, r)
	}
	return b, now
}

// TestBreakerTripsOnAJump: from a 5% baseline, a host that fails every call
// trips within 10 calls, and one that fails 60% within 2s at 200 calls a
// second.
func TestBreakerTripsOnAJump(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 5))
		b, now := learned(t, seed, rng)
		if at := flaky(b, now, 5*time.Millisecond, 10, 1, rng); at < 0 {
			t.Fatalf("seed %d: 5%% then 100%%: still closed after 10 calls", seed)
		}
		b, now = learned(t, seed, rng)
		if at := flaky(b, now, 5*time.Millisecond, 400, 0.6, rng); at < 0 {
			t.Fatalf("seed %d: 5%% then 60%%: still closed after 2s at 200 calls a second", seed)
		}
	}
}

// TestBreakerRunsIgnoreConcurrency: failures of attempts that were in
// flight together are one failure of a run; an explicit
// ConsecutiveFailures counts each.
func TestBreakerRunsIgnoreConcurrency(t *testing.T) {
	together := func(b *Breaker, at time.Time, n int) BreakerChange {
		perms := make([]BreakerPermit, n)
		for i := range perms {
			perms[i], _ = b.Allow(at)
		}
		var last BreakerChange
		for _, p := range perms {
			if c := b.Done(at.Add(10*time.Millisecond), p, policy.Failure); c.Changed() {
				last = c
			}
		}
		return last
	}
	b := newBreaker(policy.Breaker{MinCalls: 100}, bkStart, 1)
	if c := together(b, bkStart, 16); c.Changed() {
		t.Fatalf("16 attempts failing together: %+v, want no trip: they are one failure of the run", c)
	}
	now := bkStart.Add(20 * time.Millisecond)
	for i := range 4 {
		p, _ := b.Allow(now)
		c := b.Done(now.Add(time.Millisecond), p, policy.Failure)
		if want := i == 3; c.Changed() != want {
			t.Fatalf("sequential failure %d after them: change %+v, want a trip %v (the run is 1 + %d)", i+1, c, want, i+1)
		}
		now = now.Add(2 * time.Millisecond)
	}

	b = newBreaker(policy.Breaker{ConsecutiveFailures: 5, MinCalls: 100}, bkStart, 1)
	if c := together(b, bkStart, 16); c != bkTrip {
		t.Fatalf("ConsecutiveFailures 5, 16 failing together: %+v, want a trip", c)
	}
}

// TestBreakerBaselineFromSlices: a host flaky from its start gets a
// baseline from its first slice, and keeps it across an opening.
func TestBreakerBaselineFromSlices(t *testing.T) {
	b := newBreaker(policy.Breaker{}, bkStart, 1) // slices of 7.5s
	rng := rand.New(rand.NewPCG(3, 3))
	if at := flaky(b, bkStart, 10*time.Millisecond, 800, 0.35, rng); at >= 0 { // 8s
		t.Fatalf("tripped at call %d", at)
	}
	now := bkStart.Add(8 * time.Second)
	r := b.Rate(now)
	if !r.BaselineKnown || math.Abs(r.Baseline-0.35) > 0.06 || r.TripPoint != breakerTripCeiling {
		t.Fatalf("after 8s at 35%%: Rate = %+v, want a baseline near 0.35 and the ceiling trip point", r)
	}
	// The host dies: 35% makes a run of 14 the trip.
	calls := 0
	for ; b.State(now) == policy.BreakerClosed; calls++ {
		p, _ := b.Allow(now)
		b.Done(now, p, policy.Failure)
		now = now.Add(10 * time.Millisecond)
	}
	if calls != runLength(r.Baseline) {
		t.Fatalf("dead after a %.3f baseline: tripped after %d failures, want %d", r.Baseline, calls, runLength(r.Baseline))
	}
	// The trip's period is a sample without its run: what is left is
	// about as flaky as before.
	r = b.Rate(now)
	if math.Abs(r.Baseline-0.35) > 0.06 {
		t.Fatalf("after the trip: Rate = %+v, want the baseline still near 0.35: the run that tripped is not learned", r)
	}
	now = now.Add(2 * time.Second)
	p, d := b.Allow(now)
	if !d.OK || b.Done(now, p, policy.Success) != bkRecover {
		t.Fatalf("probe after 2s: %+v, want admitted and closing", d)
	}
	if got := b.Rate(now); got.Baseline != r.Baseline || !got.BaselineKnown {
		t.Fatalf("after the opening: Rate = %+v, want the baseline kept at %v", got, r.Baseline)
	}
}

// outage runs 16 callers, each asking every 10ms, against a breaker while
// the host is down for down and then back; an admitted attempt answers 1ms
// later. It returns the attempts admitted per second of the outage after
// its first, and the time from the host's return to the first success.
func outage(t *testing.T, cfg policy.Breaker, down time.Duration, seed uint64) (perSecond float64, recovered time.Duration) {
	t.Helper()
	b := newBreaker(cfg, bkStart, seed)
	type pending struct {
		p  BreakerPermit
		at time.Time
	}
	var out []pending
	admitted := 0
	const tick = time.Millisecond
	for now := bkStart; now.Before(bkStart.Add(down + time.Minute)); now = now.Add(tick) {
		up := !now.Before(bkStart.Add(down))
		kept := out[:0]
		for _, q := range out {
			if now.Before(q.at) {
				kept = append(kept, q)
				continue
			}
			o := policy.Failure
			if up {
				o = policy.Success
			}
			b.Done(now, q.p, o)
			if up {
				return float64(admitted) / (down - time.Second).Seconds(), now.Sub(bkStart.Add(down))
			}
		}
		out = kept
		if now.Sub(bkStart)%(10*time.Millisecond) != 0 {
			continue
		}
		for range 16 {
			p, d := b.Allow(now)
			if !d.OK {
				continue
			}
			if now.Sub(bkStart) >= time.Second && !up {
				admitted++
			}
			out = append(out, pending{p, now.Add(tick)})
		}
	}
	t.Fatalf("no success within a minute of the host's return")
	return 0, 0
}

// TestBreakerRecoversAsABackoff: an 8s outage is over for callers within
// 1.5s of the host's return, at no more than 3 attempts a second after its
// first second; a 2-minute one, within an eighth of its length, at far
// fewer. With a negative FirstOpenFor every opening is OpenFor.
func TestBreakerRecoversAsABackoff(t *testing.T) {
	for seed := range uint64(20) {
		rate, lag := outage(t, policy.Breaker{}, 8*time.Second, seed)
		if rate > 3 || lag > 1500*time.Millisecond {
			t.Fatalf("seed %d, 8s outage: %.2f attempts/s after its first second, first success %v after the return; want <= 3/s, <= 1.5s", seed, rate, lag)
		}
		if seed >= 5 {
			continue
		}
		rate, lag = outage(t, policy.Breaker{}, 2*time.Minute, seed)
		if rate > 1 || lag > 2*time.Minute/8*5/4 {
			t.Fatalf("seed %d, 2m outage: %.2f attempts/s, first success %v after the return; want <= 1/s, <= 2m/8 (jittered)", seed, rate, lag)
		}
	}
	// Each failed probe lengthens the next opening: an eighth of the time
	// since the trip, at least FirstOpenFor, at most OpenFor, jittered.
	b := newBreaker(policy.Breaker{ConsecutiveFailures: 1}, bkStart, 1)
	now := bkStart
	var first, last time.Duration
	for i := range 40 {
		p, d := b.Allow(now)
		if !d.OK {
			t.Fatalf("at %v: refused at the end of an opening", now.Sub(bkStart))
		}
		b.Done(now, p, policy.Failure)
		_, d = b.Allow(now)
		base := min(max(time.Second, now.Sub(bkStart)/8), 5*time.Second)
		if d.RetryAfter < base || d.RetryAfter >= base*5/4 {
			t.Fatalf("opening %d, %v after the trip: lasted %v, want in [%v, %v)", i, now.Sub(bkStart), d.RetryAfter, base, base*5/4)
		}
		if i == 0 {
			first = d.RetryAfter
		}
		last = d.RetryAfter
		now = now.Add(d.RetryAfter)
	}
	if first >= 1250*time.Millisecond || last < 5*time.Second {
		t.Fatalf("openings went from %v to %v, want from about 1s to OpenFor (5s)", first, last)
	}

	b = newBreaker(policy.Breaker{ConsecutiveFailures: 1, FirstOpenFor: -1}, bkStart, 1)
	p, _ := b.Allow(bkStart)
	b.Done(bkStart, p, policy.Failure)
	if _, d := b.Allow(bkStart); d.RetryAfter < 5*time.Second {
		t.Fatalf("FirstOpenFor -1: first opening %v, want OpenFor", d.RetryAfter)
	}
}
