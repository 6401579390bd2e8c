package transport

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestHedgedShareFollowsAPhasedLatency: an upstream that answers in 1ms
// for 3s and then in 4ms for 1s, over and over, at 250 calls a second (an
// open loop: each call on its own goroutine), with the budget off so that
// nothing but the threshold decides. The window, a quarter of whose calls
// take 4ms, answers the 4ms bucket; the last seconds answer 1ms in the
// long phase. Each step up must end a 1ms answer within a few calls, so
// that the share of calls hedged stays at most 1.5 × (1 − Quantile): 7.5%
// at the p95, where a 1ms answer kept for the rest of its period hedged
// nearly every call of a 4ms phase's first half-second.
func TestHedgedShareFollowsAPhasedLatency(t *testing.T) {
	const cycle = 4 * time.Second
	testHedgedShare(t, 3*cycle, 10*cycle, func(at time.Duration) time.Duration {
		if at%cycle < 3*time.Second {
			return time.Millisecond
		}
		return 4 * time.Millisecond
	})
}

// TestHedgedShareFollowsARamp: an upstream whose latency rises by 1ms
// every second, from 5ms, as TestHedgedShareFollowsAPhasedLatency drives
// it, counted from 12s to 52s (17ms to 57ms). The window's p95 is the
// latency of over a second before (a twentieth of the 22.5-30s it holds),
// below every call's: the threshold must follow the last seconds up, so
// that at most 1.5 × (1 − Quantile) of the calls are hedged.
func TestHedgedShareFollowsARamp(t *testing.T) {
	testHedgedShare(t, 12*time.Second, 40*time.Second, func(at time.Duration) time.Duration {
		return 5*time.Millisecond + at/1000
	})
}

// TestHedgedShareFollowsAStaircase: an upstream whose latency rises by a
// quarter every 2s, from 1ms, as TestHedgedShareFollowsAPhasedLatency
// drives it, counted from 12s to 42s (3.8ms to 108ms). Each step lies two
// or three histogram buckets above the one before, and the window takes a
// twentieth of its 22.5-30s, over a second, to see it: the threshold must
// follow the last seconds up, so that at most 1.5 × (1 − Quantile) of the
// calls are hedged. The calls a step sends before its first answer comes
// back are hedged whatever the threshold: 250 × its latency, 27 of the
// 500 calls of the step to 108ms.
func TestHedgedShareFollowsAStaircase(t *testing.T) {
	testHedgedShare(t, 12*time.Second, 30*time.Second, func(at time.Duration) time.Duration {
		return time.Duration(float64(time.Millisecond) * math.Pow(1.25, float64(at/(2*time.Second))))
	})
}

// testHedgedShare drives a hedged transport, the budget off so that
// nothing but the threshold decides, at 250 calls a second (an open loop:
// each call on its own goroutine) against an upstream that answers a call
// started at after the start in latency(after), and checks that the calls
// started in the measured span after warmFor are hedged at most 1.5 × (1
// − Quantile) of the time: 7.5% at the p95.
func testHedgedShare(t *testing.T, warmFor, measured time.Duration, latency func(time.Duration) time.Duration) {
	t.Helper()
	const (
		rate     = 250
		q        = 0.95
		maxShare = 1.5 * (1 - q)
	)
	synctest.Test(t, func(t *testing.T) {
		begin := time.Now()
		base := &slowRT{latency: func(int64, *http.Request) (time.Duration, int) {
			return latency(time.Since(begin)), 200
		}}
		var hedged, hedges, won atomic.Int64 // calls hedged, hedges started and won
		tr := mustNew(t, Config{
			Base: base,
			Policies: policy.Set{
				Hedge:  &policy.Hedge{Quantile: q},
				Budget: policy.Budget{Ratio: -1},
			},
			Observer: &policy.Observer{
				HedgeStarted: func(h policy.HedgeInfo) {
					if first, ok := h.Context.Value(measuredKey{}).(*atomic.Bool); ok {
						hedges.Add(1)
						if first.CompareAndSwap(false, true) {
							hedged.Add(1)
						}
					}
				},
				HedgeWon: func(h policy.HedgeInfo) {
					if _, ok := h.Context.Value(measuredKey{}).(*atomic.Bool); ok {
						won.Add(1)
					}
				},
			},
		})
		var wg sync.WaitGroup
		calls := 0
		for i := 0; ; i++ {
			at := time.Duration(i) * time.Second / rate
			if at >= warmFor+measured {
				break
			}
			time.Sleep(time.Until(begin.Add(at)))
			ctx := t.Context()
			if at >= warmFor {
				ctx = context.WithValue(ctx, measuredKey{}, new(atomic.Bool))
				calls++
			}
			wg.Go(func() {
				if _, err := do(t, ctx, tr); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		share := float64(hedged.Load()) / float64(calls)
		t.Logf("%d of %d calls hedged (%.1f%%), %d hedges, %d won", hedged.Load(), calls, 100*share, hedges.Load(), won.Load())
		if share > maxShare {
			t.Errorf("%.1f%% of calls hedged, want at most %.1f%% (1.5 × (1 − %v))", 100*share, 100*maxShare, q)
		}
	})
}

// measuredKey marks, in a call's context, a call the test counts, with
// whether it has been hedged.
type measuredKey struct{}

// TestHedgeThresholdComesDownAfterABrownout is TestHedgeRecovery in
// virtual time, over an in-memory upstream: 250 calls a second, a calm of
// 10s (97% of calls 4ms, 3% 100ms), a brownout of 8s (35-45ms), and the
// calm again. The threshold the brownout raised must come down, so that
// the p99 of the calls that start 3-8s after the brownout is at most 1.5×
// the calm's (the last 2s before it), where a threshold kept up would
// leave the 3% at the brownout's threshold plus a fast call.
func TestHedgeThresholdComesDownAfterABrownout(t *testing.T) {
	const (
		rate     = 250
		calm     = 10 * time.Second
		brownout = 8 * time.Second
		after    = 8 * time.Second
		end      = calm + brownout
	)
	synctest.Test(t, func(t *testing.T) {
		begin := time.Now()
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(3, 4))
		base := &slowRT{latency: func(int64, *http.Request) (time.Duration, int) {
			mu.Lock()
			defer mu.Unlock()
			if at := time.Since(begin); at >= calm && at < end {
				return 35*time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Millisecond))), 200
			}
			if rng.IntN(100) < 3 {
				return 100 * time.Millisecond, 200
			}
			return 4 * time.Millisecond, 200
		}}
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{}}})
		var (
			wg                 sync.WaitGroup
			before, afterwards []time.Duration
		)
		for i := 0; ; i++ {
			at := time.Duration(i) * time.Second / rate
			if at >= end+after {
				break
			}
			time.Sleep(time.Until(begin.Add(at)))
			wg.Go(func() {
				start := time.Now()
				if _, err := do(t, t.Context(), tr); err != nil {
					t.Error(err)
					return
				}
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case at >= calm-2*time.Second && at < calm:
					before = append(before, d)
				case at >= end+3*time.Second:
					afterwards = append(afterwards, d)
				}
			})
		}
		wg.Wait()
		p99 := func(ds []time.Duration) time.Duration {
			slices.Sort(ds)
			return ds[len(ds)*99/100]
		}
		calmP99, afterP99 := p99(before), p99(afterwards)
		t.Logf("p99: calm %v, 3-8s after the brownout %v (%.2f×); threshold now %v", calmP99, afterP99, float64(afterP99)/float64(calmP99), tr.Measured("up.test").HedgeThreshold)
		if afterP99 > calmP99*3/2 {
			t.Errorf("p99 3-8s after the brownout %v, want at most 1.5× the calm's %v", afterP99, calmP99)
		}
	})
}
