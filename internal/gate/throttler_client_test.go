package gate

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// thAnswer is how the backend answers an attempt: after latency, accepted
// or not.
type thAnswer struct {
	latency  time.Duration
	accepted bool
}

// thClient drives th as one client's transport does: an attempt every
// 1/rate from thStart for dur, each admitted one answered by backend (given
// its offset from thStart) and reported to Done at its answer's instant,
// Admits and Dones in the order of their instants. It returns, for each
// attempt, its offset and whether the throttler admitted it.
func thClient(th *Throttler, rate float64, dur time.Duration, backend func(sent time.Duration) thAnswer) []thSent {
	type done struct {
		at       time.Duration
		accepted bool
	}
	var pending []done // sorted by at
	var sent []thSent
	every := time.Duration(float64(time.Second) / rate)
	for at := time.Duration(0); at < dur; at += every {
		for len(pending) > 0 && pending[0].at <= at {
			d := pending[0]
			pending = pending[1:]
			o := policy.Success
			if !d.accepted {
				o = policy.Failure
			}
			th.Done(thStart.Add(d.at), o, d.accepted, nil)
		}
		ok := th.Admit(thStart.Add(at), shedding.Critical, "").OK
		sent = append(sent, thSent{at, ok})
		if ok {
			a := backend(at)
			d := done{at + a.latency, a.accepted}
			i, _ := slices.BinarySearchFunc(pending, d.at, func(p done, at time.Duration) int {
				return int(min(max(p.at-at, -1), 1)) // after equal instants: FIFO
			})
			for i < len(pending) && pending[i].at == d.at {
				i++
			}
			pending = slices.Insert(pending, i, d)
		}
	}
	return sent
}

// thSent is an attempt of thClient: its offset from thStart, and whether
// it was admitted.
type thSent struct {
	at       time.Duration
	admitted bool
}

// thRefused returns the share of the attempts sent in [from, to) that the
// throttler refused, and how many there were.
func thRefused(sent []thSent, from, to time.Duration) (share float64, n int) {
	refused := 0
	for _, s := range sent {
		if s.at >= from && s.at < to {
			n++
			if !s.admitted {
				refused++
			}
		}
	}
	if n == 0 {
		return 0, 0
	}
	return float64(refused) / float64(n), n
}

// TestThrottlerSlowHealthyBackend: a backend that accepts every attempt,
// each after 3 s, is not throttled, whatever the window: an attempt still
// on its way is no evidence that the backend refused it. A client of 12.8
// attempts a second with a one-second window has about 38 attempts in
// flight and, until the first answers come back, none answered.
func TestThrottlerSlowHealthyBackend(t *testing.T) {
	for _, cfg := range []policy.Throttler{
		{Window: time.Second, MinRequests: 5},
		{Window: 2 * time.Second, MinRequests: 5},
		{},
	} {
		th := newThrottler(cfg, thStart, 3)
		sent := thClient(th, 12.8, time.Minute, func(time.Duration) thAnswer {
			return thAnswer{3 * time.Second, true}
		})
		if share, n := thRefused(sent, 0, time.Minute); share != 0 {
			t.Errorf("Window %v, MinRequests %d: refused %.3f of %d attempts to a healthy backend, want none",
				cfg.Window, cfg.MinRequests, share, n)
		}
	}
}

// TestThrottlerHealthyNoisyBackend: a backend whose latency varies widely
// (log-normal, median 20 ms, a tenth of the attempts over 250 ms, some
// over 3 s) and that refuses one attempt in a hundred at random is not
// throttled at the defaults, for a client of 12.8 attempts a second as
// for one of 200.
func TestThrottlerHealthyNoisyBackend(t *testing.T) {
	for _, rate := range []float64{12.8, 200} {
		rng := rand.New(rand.NewPCG(5, uint64(rate)))
		th := newThrottler(policy.Throttler{}, thStart, 5)
		sent := thClient(th, rate, 10*time.Minute, func(time.Duration) thAnswer {
			lat := time.Duration(float64(20*time.Millisecond) * math.Exp(2*rng.NormFloat64()))
			return thAnswer{lat, rng.Float64() >= 0.01}
		})
		if share, n := thRefused(sent, 0, 10*time.Minute); share != 0 {
			t.Errorf("%v attempts a second: refused %.4f of %d attempts to a healthy backend, want none", rate, share, n)
		}
	}
}

// TestThrottlerDefaultsCatchAQueuePastTheDeadline is one client of a fleet
// whose server's queue outgrows its callers' deadlines, at the defaults:
// 12.8 attempts a second, each with a 1 s deadline; answered in 10 ms
// until 3 s, then from a queue whose wait grows by 3 s a second, so that
// from 3.33 s on every attempt ends at its deadline, not accepted (the
// transport's report of an attempt its caller's deadline ended), until the
// queue is gone at 9 s and the answers take 10 ms again. The throttler
// must refuse most attempts within about a second of the first deadline
// that ends (4.33 s), and let nearly all through within about two seconds
// of the last one (10 s).
func TestThrottlerDefaultsCatchAQueuePastTheDeadline(t *testing.T) {
	const (
		calmUntil = 3 * time.Second
		backAt    = 9 * time.Second
		deadline  = time.Second
	)
	backend := func(sent time.Duration) thAnswer {
		if sent < calmUntil || sent >= backAt {
			return thAnswer{10 * time.Millisecond, true}
		}
		wait := 3*(sent-calmUntil) + 50*time.Millisecond
		if wait >= deadline {
			return thAnswer{deadline, false}
		}
		return thAnswer{wait, true}
	}
	least, most := 1.0, 0.0
	for seed := range uint64(20) {
		th := newThrottler(policy.Throttler{}, thStart, seed)
		sent := thClient(th, 12.8, 20*time.Second, backend)
		if share, _ := thRefused(sent, 0, calmUntil); share != 0 {
			t.Errorf("seed %d: refused %.3f of the calm's attempts", seed, share)
		}
		during, n := thRefused(sent, 5500*time.Millisecond, backAt)
		if during < 0.6 {
			t.Errorf("seed %d: refused %.3f of the %d attempts from 5.5 s to the queue's end, want most", seed, during, n)
		}
		after, n := thRefused(sent, 12*time.Second, 20*time.Second)
		if after > 0.02 {
			t.Errorf("seed %d: refused %.3f of the %d attempts from 12 s on, want at most 0.02", seed, after, n)
		}
		least, most = min(least, during), max(most, after)
	}
	t.Logf("over 20 seeds: refused at least %.3f from 5.5 s to 9 s, at most %.3f from 12 s on", least, most)
}
