package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// The rate-limited hedging scenario: the quick-start chain (retry, hedge
// at p95, throttler, breaker, limiter, timeouts) on a key with
// RateLimit{PerSecond: 50, Burst: 10}, untagged (Critical) calls arriving
// at random (Poisson) with a deadline of a second, over an upstream that
// answers in 5ms, but the first leg of one call in 20, which takes 100ms.
// For 30s the calls come at 48 a second, close to the limit, so tokens
// are scarce; for 30s more at 20 a second, so they are plentiful. Each
// run is made twice, with Hedge and without, over the same arrivals and
// the same slow calls.
//
// A hedge is optional work: on a rate-limited key it takes a token only
// when Degraded's reserve is left after it, and never waits. The targets:
//
//   - while tokens are scarce, the Critical calls refused, the calls that
//     waited and their total wait are those of the run without Hedge,
//     within 10% (and 3 calls, or 100ms);
//   - while they are plentiful, hedges still fire: at least half the slow
//     calls are hedged.
const (
	rlhRate     = 50
	rlhBurst    = 10
	rlhScarce   = 48 // calls a second
	rlhPlenty   = 20
	rlhPhase    = 30 * time.Second
	rlhSlowOne  = 20 // one first leg in 20 is slow
	rlhFast     = 5 * time.Millisecond
	rlhSlow     = 100 * time.Millisecond
	rlhDeadline = time.Second
)

// rlhFigures is what one phase of a run measured of its calls.
type rlhFigures struct {
	calls, slow      int           // calls made; of which slow on their first leg
	refused          int           // refused by a gate
	failed           int           // any other error
	waited           int           // calls whose first leg waited at a gate
	wait             time.Duration // their waits, summed
	hedges, hedgeWon int64
}

func (f rlhFigures) String() string {
	return fmt.Sprintf("%d calls (%d slow): %d refused, %d failed, %d waited %v in all; %d hedges, %d won",
		f.calls, f.slow, f.refused, f.failed, f.waited, f.wait, f.hedges, f.hedgeWon)
}

// rlhKey carries a call's index in its context, for the base.
type rlhKey struct{}

// runRateLimitedHedging runs both phases through set, returning the
// figures of each. Arrivals and slow calls come from a fixed seed.
func runRateLimitedHedging(t *testing.T, set policy.Set, maxWait time.Duration) (scarce, plenty rlhFigures) {
	set.RateLimit = &policy.RateLimit{PerSecond: rlhRate, Burst: rlhBurst, MaxWait: maxWait}
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 11))
		type arrival struct {
			at   time.Duration
			slow bool
		}
		var arrivals []arrival
		phaseOf := func(at time.Duration) int { return int(at / rlhPhase) }
		for at := time.Duration(0); at < 2*rlhPhase; {
			rate := float64(rlhScarce)
			if phaseOf(at) == 1 {
				rate = rlhPlenty
			}
			at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			arrivals = append(arrivals, arrival{at: at, slow: rng.IntN(rlhSlowOne) == 0})
		}
		arrivals = arrivals[:len(arrivals)-1] // the last is past the end

		start := time.Now()
		var mu sync.Mutex
		legs := map[int]int{} // wire calls so far, by call
		var figs [2]rlhFigures
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			i := r.Context().Value(rlhKey{}).(int)
			a := arrivals[i]
			mu.Lock()
			legs[i]++
			first := legs[i] == 1
			if first {
				if w := time.Since(start) - a.at; w > 0 {
					f := &figs[phaseOf(a.at)]
					f.waited++
					f.wait += w
				}
			}
			mu.Unlock()
			if first && a.slow {
				return respondAfter(r, rlhSlow)
			}
			return respondAfter(r, rlhFast)
		})
		var hedges, won [2]atomic.Int64
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
			HedgeStarted: func(h policy.HedgeInfo) { hedges[phaseOf(arrivals[h.Context.Value(rlhKey{}).(int)].at)].Add(1) },
			HedgeWon:     func(h policy.HedgeInfo) { won[phaseOf(arrivals[h.Context.Value(rlhKey{}).(int)].at)].Add(1) },
		}})

		var wg sync.WaitGroup
		for i, a := range arrivals {
			time.Sleep(a.at - time.Since(start))
			f := &figs[phaseOf(a.at)]
			f.calls++
			if a.slow {
				f.slow++
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.WithValue(t.Context(), rlhKey{}, i), rlhDeadline)
				defer cancel()
				_, err := do(t, ctx, tr)
				if err == nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if errors.Is(err, policy.ErrRejected) {
					figs[phaseOf(a.at)].refused++
				} else {
					figs[phaseOf(a.at)].failed++
				}
			})
		}
		wg.Wait()
		for p := range figs {
			figs[p].hedges, figs[p].hedgeWon = hedges[p].Load(), won[p].Load()
		}
		scarce, plenty = figs[0], figs[1]
	})
	return scarce, plenty
}

// TestHedgesLeaveCriticalTheirTokens runs the rate-limited hedging
// scenario with and without Hedge, MaxWait 0 (the RateLimit) and
// 250ms, and checks its targets.
func TestHedgesLeaveCriticalTheirTokens(t *testing.T) {
	chain := func(hedge bool) policy.Set {
		s := policy.Set{
			Attempts:  3,
			Retry:     &policy.Retry{},
			Throttler: &policy.Throttler{},
			Breaker:   &policy.Breaker{},
			Limiter:   &policy.Limiter{},
			Timeout:   &policy.Timeout{PerAttempt: 2 * time.Second},
		}
		if hedge {
			s.Hedge = &policy.Hedge{Quantile: 0.95}
		}
		return s
	}
	within := func(got, want, slack int) bool { return got <= want+max(slack, want/10) }
	for _, maxWait := range []time.Duration{0, 250 * time.Millisecond} {
		t.Run(fmt.Sprintf("MaxWait=%v", maxWait), func(t *testing.T) {
			scarce, plenty := runRateLimitedHedging(t, chain(true), maxWait)
			scarceOff, plentyOff := runRateLimitedHedging(t, chain(false), maxWait)
			t.Logf("scarce, Hedge:    %v", scarce)
			t.Logf("scarce, no Hedge: %v", scarceOff)
			t.Logf("plenty, Hedge:    %v", plenty)
			t.Logf("plenty, no Hedge: %v", plentyOff)
			if scarce.calls != scarceOff.calls || scarce.calls < 1000 {
				t.Fatalf("%d and %d calls while tokens are scarce, want the same, about 1,440", scarce.calls, scarceOff.calls)
			}
			if scarce.failed+scarceOff.failed+plenty.failed+plentyOff.failed != 0 {
				t.Errorf("calls failed other than by a refusal")
			}
			if !within(scarce.refused, scarceOff.refused, 3) {
				t.Errorf("tokens scarce: %d Critical calls refused with Hedge, %d without; want within 10%% (or 3)", scarce.refused, scarceOff.refused)
			}
			if !within(scarce.waited, scarceOff.waited, 3) ||
				scarce.wait > scarceOff.wait+max(100*time.Millisecond, scarceOff.wait/10) {
				t.Errorf("tokens scarce: %d Critical calls waited %v with Hedge, %d waited %v without; want within 10%% (or 3, 100ms)",
					scarce.waited, scarce.wait, scarceOff.waited, scarceOff.wait)
			}
			if plenty.hedges*2 < int64(plenty.slow) {
				t.Errorf("tokens plentiful: %d hedges for %d slow calls, want at least half of them hedged", plenty.hedges, plenty.slow)
			}
		})
	}
}
