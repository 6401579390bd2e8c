package transport

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/resilix/resilix/policy"
)

// TestInBubble holds inBubble, which decides whether a call may take a
// pooled timer, to the Go release in use: a time read inside a synctest
// bubble has no monotonic reading, one read outside has.
func TestInBubble(t *testing.T) {
	if inBubble(time.Now()) {
		t.Fatal("outside a bubble: inBubble(time.Now()) is true")
	}
	synctest.Test(t, func(t *testing.T) {
		if !inBubble(time.Now()) {
			t.Fatal("inside a bubble: inBubble(time.Now()) is false; a pooled timer could cross bubbles")
		}
	})
}

// TestPooledTimeoutsFireForTheirOwnCall runs, outside any bubble, calls
// with a per-attempt timeout from several goroutines, half of them to a
// base that answers at once (their timers stop in time and are reused)
// and half to one that waits for its context. A reused timer must fire
// for the call that armed it last, after that call's full PerAttempt, and
// never for a call that has its headers: every slow call times out, none
// before PerAttempt, and every fast call's context is live until its body
// is closed.
func TestPooledTimeoutsFireForTheirOwnCall(t *testing.T) {
	const perAttempt = 20 * time.Millisecond
	tr := mustNew(t, Config{
		Base: fakeRT(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("Slow") != "" {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return respond(r, 200), nil
		}),
		Policies: policy.Set{Timeout: &policy.Timeout{PerAttempt: perAttempt}},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
				slow := (g+i)%4 == 0
				if slow {
					req.Header.Set("Slow", "1")
				}
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				took := time.Since(start)
				switch {
				case slow && !errors.Is(err, policy.ErrAttemptTimeout):
					t.Errorf("a slow call: %v, want ErrAttemptTimeout", err)
				case slow && took < perAttempt:
					t.Errorf("a slow call timed out after %v, before its PerAttempt (%v)", took, perAttempt)
				case slow:
				case err != nil:
					t.Errorf("a fast call: %v", err)
				default:
					time.Sleep(perAttempt / 10) // a stale timer would fire here
					if err := resp.Request.Context().Err(); err != nil {
						t.Errorf("a fast call's context ended before its body was closed: %v", err)
					}
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
}

// TestAlarmRingsWhenDueAndOnlyThen holds the alarm's lazy timer, in a
// bubble so that each ring's time is exact, re-arming a stopped alarm as
// the pool does outside bubbles: an alarm rings at the time it was armed
// for; one stopped and armed again for later while its timer waits for
// the earlier time rings at the later (the timer fires, finds the alarm
// not due and sets itself again); one armed again for earlier moves its
// timer; and a stopped alarm never rings though its timer fires.
func TestAlarmRingsWhenDueAndOnlyThen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			start = time.Now()
			rang  []time.Duration
		)
		ring := func(cause error) {
			if cause != policy.ErrAttemptTimeout {
				t.Errorf("rang with %v", cause)
			}
			mu.Lock()
			rang = append(rang, time.Since(start))
			mu.Unlock()
		}
		got := func() []time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(rang)
		}
		restart := func() {
			mu.Lock()
			rang, start = nil, time.Now()
			mu.Unlock()
		}
		ms := time.Millisecond

		a := newAlarm(start, start.Add(10*ms), ring)
		time.Sleep(5 * ms)
		if !a.stop() {
			t.Fatal("stopped before it was due: stop false")
		}
		a.rearm(start.Add(20*ms), ring) // later: no timer work now
		time.Sleep(50 * ms)
		if !slices.Equal(got(), []time.Duration{20 * ms}) || a.stop() {
			t.Fatalf("armed for 10ms, again for 20ms: rang at %v, want [20ms] and stop false", got())
		}

		restart()
		a = newAlarm(time.Now(), time.Now().Add(30*ms), ring)
		a.stop()
		a.rearm(time.Now().Add(15*ms), ring) // earlier: the timer moves
		time.Sleep(50 * ms)
		if !slices.Equal(got(), []time.Duration{15 * ms}) {
			t.Fatalf("armed for 30ms, again for 15ms: rang at %v, want [15ms]", got())
		}

		restart()
		a = newAlarm(time.Now(), time.Now().Add(10*ms), ring)
		time.Sleep(5 * ms)
		if !a.stop() {
			t.Fatal("stopped before it was due: stop false")
		}
		time.Sleep(50 * ms) // the timer fires at 10ms, idle
		if len(got()) != 0 {
			t.Fatalf("a stopped alarm rang at %v", got())
		}
	})
}

// TestPooledAlarmTakesItsOwnTime holds the reuse of a pooled alarm whose
// timer is still set for its last call, outside any bubble (so with the
// pool): a next call due earlier than that timer still rings in time, and
// a call due later is not rung when the timer set for the last call fires.
func TestPooledAlarmTakesItsOwnTime(t *testing.T) {
	rang := make(chan time.Time, 4)
	ring := func(error) { rang <- time.Now() }

	start := time.Now()
	newAlarm(start, start.Add(time.Hour), ring).stop()
	start = time.Now()
	newAlarm(start, start.Add(5*time.Millisecond), ring) // likely the same alarm
	select {
	case at := <-rang:
		if at.Sub(start) < 5*time.Millisecond {
			t.Fatalf("rang after %v, before the 5ms it was armed for", at.Sub(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an alarm armed for 5ms, taken from the pool with its timer set for an hour, never rang")
	}

	start = time.Now()
	newAlarm(start, start.Add(5*time.Millisecond), ring).stop()
	start = time.Now()
	a := newAlarm(start, start.Add(time.Hour), ring) // the timer for 5ms is still set
	time.Sleep(50 * time.Millisecond)
	if !a.stop() {
		t.Fatal("an alarm armed for an hour rang, or was disarmed, within 50ms")
	}
	select {
	case at := <-rang:
		t.Fatalf("an alarm rang %v after the stop of its last call", at.Sub(start))
	default:
	}
}

// TestPooledRoundsServeTheirOwnCall runs, outside any bubble (so with the
// pool of rounds), hedging calls from several goroutines: 60% answered at
// once and 40% after 5ms, hedged at the median, so that the round's timer
// fires in every slow call (its deadline comes before the slow answer's,
// however late a loaded machine runs timers), while the budget, soon
// empty, refuses most hedges, and a fire runs on, suppressing its hedge,
// while the caller gets its answer. A round whose timer fired must never
// go back to the pool (under -race, reusing it while that fire reads it
// is a data race), and every call must get the answer to its own request.
func TestPooledRoundsServeTheirOwnCall(t *testing.T) {
	var (
		mu      sync.Mutex
		started int
		refused = map[policy.SuppressReason]int{}
	)
	tr := mustNew(t, Config{
		Base: fakeRT(func(r *http.Request) (*http.Response, error) {
			if rand.IntN(10) < 4 {
				select {
				case <-time.After(5 * time.Millisecond):
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
			return respond(r, 200, "Id", r.Header.Get("Id")), nil
		}),
		Policies: policy.Set{Hedge: &policy.Hedge{Quantile: 0.5, MinSamples: 5}},
		Observer: &policy.Observer{
			HedgeStarted: func(policy.HedgeInfo) {
				mu.Lock()
				started++
				mu.Unlock()
			},
			HedgeSuppressed: func(s policy.HedgeSuppression) {
				mu.Lock()
				refused[s.Reason]++
				mu.Unlock()
			},
		},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				id := strconv.Itoa(g*1000 + i)
				req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
				req.Header.Set("Id", id)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Errorf("call %s: %v", id, err)
					continue
				}
				if got := resp.Header.Get("Id"); got != id {
					t.Errorf("call %s got the answer to %s", id, got)
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if started == 0 || refused[policy.HedgeBudget] == 0 {
		t.Fatalf("%d hedges started, suppressed %v: the test must see hedges both started and refused by the budget", started, refused)
	}
	t.Logf("%d hedges started, suppressed %v", started, refused)
}

// TestADroppedAlarmIsCollected: an alarm the pool drops (the garbage
// collector empties sync.Pools) while its timer is still set, an hour
// ahead, must not be kept alive by that timer; else every swing of
// concurrency would leave alarms behind for a PerAttempt, and memory
// would grow with PerAttempt times the rate of swings.
func TestADroppedAlarmIsCollected(t *testing.T) {
	start := time.Now()
	a := newAlarm(start, start.Add(time.Hour), func(error) {})
	w := weak.Make(a)
	a.stop() // into the pool, its timer still set for an hour
	a = nil
	for range 4 { // the pool's primary and victim caches, and slack
		runtime.GC()
	}
	if w.Value() != nil {
		t.Fatal("a pooled alarm dropped by the pool is still reachable: its pending timer holds it")
	}
}
