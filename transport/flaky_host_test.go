package transport

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// breakerCounts counts a transport's breaker openings and refusals.
type breakerCounts struct {
	opens, refused atomic.Int64
}

func (b *breakerCounts) observer() *policy.Observer {
	return &policy.Observer{
		BreakerTransition: func(e policy.BreakerTransition) {
			if e.To == policy.BreakerOpen {
				b.opens.Add(1)
			}
		},
		Refused: func(r policy.Refusal) {
			if r.Gate == policy.GateBreaker {
				b.refused.Add(1)
			}
		},
	}
}

// driveCallers makes n calls from `callers` goroutines, one call every `every`
// per caller, and returns how many came back 200.
func driveCallers(t *testing.T, tr *Transport, url string, callers, n int, every time.Duration) int {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := c; i < n; i += callers {
				resp, err := get(t, t.Context(), tr, url)
				if err == nil {
					if resp.StatusCode == 200 {
						ok.Add(1)
					}
					resp.Body.Close()
				}
				time.Sleep(every)
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// TestTheDefaultBreakerLeavesAFlakyHostAlone: the zero Breaker on a host
// that steadily fails 35% of its calls, 3000 calls from 8 callers, with
// Retry and the budget off, as the issue measured it (the breaker opened
// and refused 2942 of 3000 calls): it never opens.
func TestTheDefaultBreakerLeavesAFlakyHostAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.LogNormal(2*time.Millisecond, 0.5),
			Faults:  []httptestutil.Fault{{Probability: 0.35, Status: 503}},
			Seed:    35,
		})
		var counts breakerCounts
		tr := mustNew(t, Config{
			Base:     up.RoundTripper(),
			Policies: policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Budget: policy.Budget{Ratio: -1}},
			Observer: counts.observer(),
		})
		ok := driveCallers(t, tr, "http://flaky.test/", 8, 3000, 5*time.Millisecond)
		if counts.opens.Load() != 0 || counts.refused.Load() != 0 {
			t.Fatalf("a host failing 35%%: the breaker opened %d times and refused %d attempts, want none", counts.opens.Load(), counts.refused.Load())
		}
		// Three attempts each: about 1 - 0.35³ = 95.7% succeed.
		if ok < 3000*94/100 {
			t.Fatalf("%d of 3000 calls succeeded, want about 95.7%%", ok)
		}
	})
}

// TestTheDefaultBreakerRecoversSoonAfterAnOutage: 16 callers against a host
// that answers 503 for 8s and then comes back: the breaker opens, costs at
// most 3 wire calls a second after the outage's first second, and lets
// calls through within 1.5s of the host's return.
func TestTheDefaultBreakerRecoversSoonAfterAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(2 * time.Millisecond)})
		var counts breakerCounts
		tracker := httptestutil.Track(up.RoundTripper())
		tr := mustNew(t, Config{
			Base:     tracker,
			Policies: policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}},
			Observer: counts.observer(),
		})
		start := time.Now()
		up.SetFaults(always503...)
		var wireAtOneSecond, wireAtEnd int64
		var firstOK atomic.Int64 // nanoseconds after start
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for time.Since(start) < 12*time.Second {
					resp, err := get(t, t.Context(), tr, "http://down.test/")
					if err == nil {
						if resp.StatusCode == 200 {
							firstOK.CompareAndSwap(0, int64(time.Since(start)))
						}
						resp.Body.Close()
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		time.Sleep(time.Second)
		wireAtOneSecond = tracker.Requests()
		time.Sleep(7 * time.Second)
		wireAtEnd = tracker.Requests()
		up.SetFaults() // back, 8s after the outage began
		wg.Wait()

		if counts.opens.Load() == 0 {
			t.Fatalf("the breaker never opened during an 8s outage")
		}
		if perSecond := float64(wireAtEnd-wireAtOneSecond) / 7; perSecond > 3 {
			t.Fatalf("%.2f wire calls a second after the outage's first second, want <= 3", perSecond)
		}
		back := time.Duration(firstOK.Load()) - 8*time.Second
		if firstOK.Load() == 0 || back > 1500*time.Millisecond {
			t.Fatalf("first success %v after the host came back, want <= 1.5s", back)
		}
	})
}
