package transport

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// stallRun is what callersThrough saw.
type stallRun struct {
	timeouts, failed int64 // calls that ended in an attempt timeout, or otherwise than by a 200
	opened           int64 // the breaker's openings
	after            error // the error of a call made once the callers stopped, nil if it got a 200
}

// callersThrough runs 40 callers in a loop against a fakeRT that answers
// in 10 ms, through set (which has a PerAttempt of 100 ms), after 40
// calls in a row: for warm, then for freeze, in which each attempt that
// reaches the base is handled by hold (it returns when the attempt's wait
// is over), and for 100 ms after; then it makes one more call. It counts
// openings with obs's BreakerTransition, after calling obs's own.
func callersThrough(t *testing.T, set policy.Set, obs *policy.Observer, warm, freeze time.Duration, hold func(r *http.Request, over <-chan struct{})) stallRun {
	var frozen atomic.Pointer[chan struct{}]
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		if c := frozen.Load(); c != nil {
			hold(r, *c)
		}
		return respondAfter(r, 10*time.Millisecond)
	})
	var run stallRun
	var opened atomic.Int64
	tell := obs.BreakerTransition
	obs.BreakerTransition = func(bt policy.BreakerTransition) {
		if tell != nil {
			tell(bt)
		}
		if bt.To == policy.BreakerOpen {
			opened.Add(1)
		}
	}
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: obs})
	for range 40 { // what a throttler knows of the host before the callers come
		if resp, err := get(t, t.Context(), tr, "http://a.test/"); err == nil {
			resp.Body.Close()
		}
	}
	var stop atomic.Bool
	var timeouts, failed atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			for !stop.Load() {
				resp, err := get(t, t.Context(), tr, "http://a.test/")
				switch {
				case errors.Is(err, policy.ErrAttemptTimeout):
					timeouts.Add(1)
				case err != nil || resp.StatusCode != 200:
					failed.Add(1)
					time.Sleep(10 * time.Millisecond) // a refusal comes at once
				}
				if resp != nil {
					resp.Body.Close()
				}
			}
		})
	}
	time.Sleep(warm)
	c := make(chan struct{})
	frozen.Store(&c)
	time.Sleep(freeze)
	frozen.Store(nil)
	close(c)
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err == nil {
		if resp.StatusCode != 200 {
			err = errors.New(resp.Status)
		}
		resp.Body.Close()
	}
	run.timeouts, run.failed, run.opened, run.after = timeouts.Load(), failed.Load(), opened.Load(), err
	return run
}

// stallSet is a key with a per-attempt timeout of 100 ms and a breaker
// that five failures in a row open.
func stallSet() policy.Set {
	return policy.Set{
		Timeout: &policy.Timeout{PerAttempt: 100 * time.Millisecond},
		Breaker: &policy.Breaker{ConsecutiveFailures: 5},
	}
}

// stalledAttempts counts the attempts Observer.AttemptDone reports
// Stalled, and those it reports timed out on time; it fails t if a
// Stalled one is not a timeout classified as a Failure.
type stalledAttempts struct {
	t               *testing.T
	stalled, onTime atomic.Int64
}

func (s *stalledAttempts) observer() *policy.Observer {
	return &policy.Observer{AttemptDone: func(a policy.AttemptInfo) {
		timedOut := errors.Is(a.Err, policy.ErrAttemptTimeout)
		switch {
		case a.Stalled && (!timedOut || a.Outcome != policy.Failure):
			s.t.Errorf("attempt reported Stalled with outcome %v, error %v, want a timeout's Failure", a.Outcome, a.Err)
		case a.Stalled:
			s.stalled.Add(1)
		case timedOut:
			s.onTime.Add(1)
		}
	}}
}

// TestAStallOfTheClientOpensNoBreaker: the client's own process stalls
// for 300 ms (a GC pause, CPU starvation, a SIGSTOP) while 40 callers
// keep a healthy host busy, with a per-attempt timeout of 100 ms. The
// stall is played by the base, which holds each attempt that comes to it
// in the stall until the stall ends, whatever its context says: the
// client does nothing meanwhile, and then ends every attempt whose
// deadline passed at once, late. The callers get their timeouts, but
// none is the host's failure: the breaker, which five failures in a row
// open, stays closed, and the next call goes through.
func TestAStallOfTheClientOpensNoBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seen := stalledAttempts{t: t}
		run := callersThrough(t, stallSet(), seen.observer(), 100*time.Millisecond, 300*time.Millisecond, func(_ *http.Request, over <-chan struct{}) {
			<-over
		})
		if run.timeouts < 20 {
			t.Fatalf("%d calls timed out in the stall, want about 40: the stall played no part", run.timeouts)
		}
		if run.opened != 0 {
			t.Errorf("the breaker opened %d times after a stall of the client ended %d attempts at their timeout", run.opened, run.timeouts)
		}
		if run.failed != 0 {
			t.Errorf("%d calls failed otherwise than by the stall's timeouts", run.failed)
		}
		if run.after != nil {
			t.Errorf("the call after the stall got %v, want a 200", run.after)
		}
		if n, m := seen.stalled.Load(), seen.onTime.Load(); n != run.timeouts || m != 0 {
			t.Errorf("the observer saw %d stalled and %d on-time timeouts, want %d and 0", n, m, run.timeouts)
		}
	})
}

// TestTimeoutsOnTimeStillOpenTheBreaker: the host, not the client, stops
// answering for 300 ms: the attempts that reach it then end at their
// timeout, on time, and open the breaker as failures of the host.
func TestTimeoutsOnTimeStillOpenTheBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seen := stalledAttempts{t: t}
		run := callersThrough(t, stallSet(), seen.observer(), 100*time.Millisecond, 300*time.Millisecond, func(r *http.Request, _ <-chan struct{}) {
			<-r.Context().Done()
		})
		if run.timeouts < 5 {
			t.Fatalf("%d calls timed out while the host was silent, want at least 5", run.timeouts)
		}
		if run.opened == 0 {
			t.Errorf("the breaker did not open after %d timeouts on time in a row", run.timeouts)
		}
		if n, m := seen.stalled.Load(), seen.onTime.Load(); n != 0 || m != run.timeouts {
			t.Errorf("the observer saw %d stalled and %d on-time timeouts, want 0 and %d", n, m, run.timeouts)
		}
	})
}

// TestAStallOfTheClientIsRetriedAndRefusedByNoGate: the same stall, on
// a key with every gate that learns from outcomes (a throttler, the
// breaker, a limiter, a hedge) and retries. The attempts the stall ended
// at their timeout are retried by the retry's own rules, as any attempt
// that timed out: here until the budget, which the stall's hedges drew
// from too, runs out. No gate refuses a call for the stall, and the
// breaker stays closed.
func TestAStallOfTheClientIsRetriedAndRefusedByNoGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := stallSet()
		set.Retry = &policy.Retry{}
		set.Throttler = &policy.Throttler{}
		set.Limiter = &policy.Limiter{InitialLimit: 100}
		set.Hedge = &policy.Hedge{}
		seen := stalledAttempts{t: t}
		var mu sync.Mutex
		refused := map[policy.Gate]int{}
		skipped := map[policy.SkipReason]int{}
		var retried atomic.Int64
		obs := seen.observer()
		done := obs.AttemptDone
		obs.AttemptDone = func(a policy.AttemptInfo) {
			done(a)
			if a.Kind == policy.AttemptRetry && a.Outcome == policy.Success {
				retried.Add(1)
			}
		}
		obs.Refused = func(r policy.Refusal) {
			mu.Lock()
			defer mu.Unlock()
			refused[r.Gate]++
		}
		obs.RetrySkipped = func(r policy.RetrySkip) {
			mu.Lock()
			defer mu.Unlock()
			skipped[r.Reason]++
		}
		run := callersThrough(t, set, obs, 100*time.Millisecond, 300*time.Millisecond, func(_ *http.Request, over <-chan struct{}) {
			<-over
		})
		if n := seen.stalled.Load(); n < 20 {
			t.Fatalf("%d attempts ended by the stall, want about 40: the stall played no part", n)
		}
		if n := retried.Load(); n == 0 {
			t.Errorf("no retry got an answer after %d attempts ended by the stall", seen.stalled.Load())
		}
		if run.failed != 0 {
			t.Errorf("%d calls failed otherwise than by the stall's timeouts", run.failed)
		}
		if run.opened != 0 {
			t.Errorf("the breaker opened %d times after a stall of the client", run.opened)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(refused) != 0 {
			t.Errorf("gates refused %v after a stall of the client", refused)
		}
		for why := range skipped {
			if why != policy.SkipBudget {
				t.Errorf("retries skipped %v, want only the budget to skip any", skipped)
				break
			}
		}
		if run.after != nil {
			t.Errorf("the call after the stall got %v, want a 200", run.after)
		}
	})
}

// TestAStallOfTheClientThrottlesNothing: the same stall strikes the 40
// callers of a host the client has made 40 calls to so far, with a
// throttler: the 40 timeouts the stall ends are no requests the host
// failed to accept, and the throttler refuses no call after it.
func TestAStallOfTheClientThrottlesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := policy.Set{
			Timeout:   &policy.Timeout{PerAttempt: 100 * time.Millisecond},
			Throttler: &policy.Throttler{},
		}
		seen := stalledAttempts{t: t}
		var throttled atomic.Int64
		obs := seen.observer()
		obs.Refused = func(policy.Refusal) { throttled.Add(1) }
		run := callersThrough(t, set, obs, 0, 300*time.Millisecond, func(_ *http.Request, over <-chan struct{}) {
			<-over
		})
		if n := seen.stalled.Load(); n < 20 {
			t.Fatalf("%d attempts ended by the stall, want about 40: the stall played no part", n)
		}
		if n := throttled.Load(); n != 0 || run.failed != 0 {
			t.Errorf("the throttler refused %d calls after a stall of the client (%d calls failed otherwise than by its timeouts)", n, run.failed)
		}
	})
}
