package transport

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// dialCount wraps base's dialer, counting the dials to addr.
func dialCount(base *http.Transport, addr string, n *atomic.Int64) *http.Transport {
	dial := base.DialContext
	base.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
		if a == addr {
			n.Add(1)
		}
		return dial(ctx, network, a)
	}
	return base
}

// lanePost sends a plain POST (not repeatable) of body to url through rt
// as call id, reads the answer, and returns the status, or the error, and
// how long the call took.
func lanePost(t *testing.T, rt http.RoundTripper, url, id string) (int, time.Duration, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("order "+id))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Call", id)
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		return 0, took, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, took, nil
}

// emptyBudget spends every token of key's budget in rt, and the config
// that keeps it empty: no floor, and a deposit too small to make a token.
func emptyBudget(rt *Transport, key string) {
	s := rt.scopes.lookup(key)
	for s.budget.Withdraw(time.Now()) {
	}
}

var budgetKeptEmpty = policy.Budget{Ratio: 1e-9, MinPerSecond: -1, Max: 1}

// TestAnUnsentRetryGoesToAnotherLaneWithoutAToken: a replica that refuses
// dials costs a call nothing while another lane is open, even with the
// budget spent and for a plain POST: the retry of an attempt that never
// left is sent at once on a lane the call has not used, and draws no
// token.
func TestAnUnsentRetryGoesToAnotherLaneWithoutAToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		for _, a := range four[:3] {
			f.serve(a, a[:1])
		}
		// four[3], d:80, is in Endpoints and refuses every dial.
		t.Cleanup(f.net.Close)
		var refused atomic.Int64
		base := dialCount(f.net.Transport(), four[3], &refused)
		// A transport for each round, so that the refusing lane is as
		// likely as any to be a first call's first pick.
		for round := range 16 {
			rt, err := New(Config{Base: base, Policies: policy.Set{
				Attempts: 2,
				Retry:    &policy.Retry{},
				Budget:   budgetKeptEmpty,
				Replicas: &policy.Replicas{Endpoints: Static(four...)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.CloseIdleConnections)
			prime(t, rt, "http://api/")
			emptyBudget(rt, "api")
			for i := range 4 {
				id := strconv.Itoa(round) + "." + strconv.Itoa(i)
				before := refused.Load()
				code, took, err := lanePost(t, rt, "http://api/", id)
				if err != nil || code != 200 {
					t.Fatalf("call %s (refused dials before it %d, after %d): %d, %v", id, before, refused.Load(), code, err)
				}
				if refused.Load() > before && took > 0 {
					t.Errorf("call %s's first attempt was refused, and its retry waited %v, want none", id, took)
				}
			}
		}
		if refused.Load() == 0 {
			t.Fatal("no call's attempt went to the refusing replica: the test tested nothing")
		}
		t.Logf("%d attempts refused", refused.Load())
	})
}

// TestUnsentAttemptsDoNotUseUpAttempts: three of four replicas in
// Endpoints refuse every dial (removed from DNS and stopped before the
// client refreshed). With Attempts 2, a call whose first two picks were
// refused failed, though the fourth replica was there; an attempt that
// never left, retried on a lane the call has not used, does not use up
// Attempts, so every call reaches the fourth.
func TestUnsentAttemptsDoNotUseUpAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve(four[3], "d") // a, b and c refuse every dial
		t.Cleanup(f.net.Close)
		most := 0 // the most attempts a call made
		for round := range 16 {
			var n int
			rt, err := New(Config{Base: f.net.Transport(), Observer: &policy.Observer{
				AttemptDone: func(policy.AttemptInfo) { n++ },
			}, Policies: policy.Set{
				Attempts: 2,
				Retry:    &policy.Retry{},
				Replicas: &policy.Replicas{Endpoints: Static(four...)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.CloseIdleConnections)
			prime(t, rt, "http://api/") // api:80 is not there either
			n = 0
			code, err := laneGet(t, rt, "http://api/", strconv.Itoa(round))
			if err != nil || code != 200 {
				t.Errorf("round %d: %d after %d attempts, %v", round, code, n, err)
			}
			most = max(most, n)
		}
		if most < 3 {
			t.Fatalf("no call made more than %d attempts: the test tested nothing", most)
		}
	})
}

// TestAnUnsentAttemptLeavesAttemptsToTheCallsOtherRetries: of three
// replicas, a refuses every dial, b answers 503 and c 200. With Attempts
// 2, a call whose first pick was a sends its free retry to b or c; one
// that went to b still has its second attempt, its retry, which goes to
// c. Every call succeeds. A transport for each call, so that a is as
// likely as any to be its first pick; about one call in 16 goes a, b, c.
func TestAnUnsentAttemptLeavesAttemptsToTheCallsOtherRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("b:80", "b")
		f.serve("c:80", "c")
		f.reps["b"].status.Store(http.StatusServiceUnavailable)
		t.Cleanup(f.net.Close)
		through := 0 // calls that went a, b, c
		for round := range 400 {
			var lanes []string
			rt, err := New(Config{Base: f.net.Transport(), Observer: &policy.Observer{
				AttemptDone: func(i policy.AttemptInfo) { lanes = append(lanes, i.Lane) },
			}, Policies: policy.Set{
				Attempts: 2,
				Retry:    &policy.Retry{},
				Replicas: &policy.Replicas{Endpoints: Static(four[:3]...)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.CloseIdleConnections)
			prime(t, rt, "http://api/") // api:80 is not there
			lanes = nil
			code, err := laneGet(t, rt, "http://api/", strconv.Itoa(round))
			if err != nil || code != 200 {
				t.Errorf("round %d: %d through %v, %v", round, code, lanes, err)
			}
			if strings.Join(lanes, " ") == "a:80 b:80 c:80" {
				through++
			}
		}
		if through == 0 {
			t.Fatal("no call went a, b, c: the test tested nothing")
		}
		t.Logf("%d of 400 calls went a, b, c", through)
	})
}

// TestFreeRetriesAreBoundByTheLanes: with every replica refusing every
// dial, a call's free retries take each lane once, and Attempts bounds
// what follows: with Attempts 2 over four lanes, the first attempt, three
// free retries, and one retry that counts.
func TestFreeRetriesAreBoundByTheLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet() // nothing is served
		t.Cleanup(f.net.Close)
		for round := range 8 {
			var n int
			rt, err := New(Config{Base: f.net.Transport(), Observer: &policy.Observer{
				AttemptDone: func(policy.AttemptInfo) { n++ },
			}, Policies: policy.Set{
				Attempts: 2,
				Retry:    &policy.Retry{},
				Budget:   policy.Budget{Ratio: -1},
				Replicas: &policy.Replicas{Endpoints: Static(four...), MaxEjected: -1},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.CloseIdleConnections)
			prime(t, rt, "http://api/")
			time.Sleep(2 * time.Second) // the refused dials' take-outs end
			n = 0
			if _, err := laneGet(t, rt, "http://api/", strconv.Itoa(round)); err == nil {
				t.Fatalf("round %d: a call to four refusing replicas succeeded", round)
			}
			if n != 5 {
				t.Errorf("round %d: %d wire attempts, want 5: one on each lane, then Attempts' second", round, n)
			}
		}
	})
}

// TestAnUnsentAttemptLeavesAttemptsToTheRoundsHedge: no connection to a
// is made (a proxy's refusal: unsent, and no refused dial, which would
// take a's lane out), b answers 503, and every replica is slow to the
// first arrival of a call. With Attempts 2, a call whose first pick was
// a, and whose free retry went to b, still has its second attempt: the
// round's hedge, which c answers. Calls 3 s apart, so that the lanes'
// failure penalties fade and a is picked first as often as any.
func TestAnUnsentAttemptLeavesAttemptsToTheRoundsHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		var refuse atomic.Bool
		base := f.net.Transport()
		dial := base.DialContext
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == "a:80" && refuse.Load() {
				return nil, &net.OpError{Op: "proxyconnect", Net: network, Err: errRefused}
			}
			return dial(ctx, network, addr)
		}
		var mu sync.Mutex  // AttemptDone runs on hedge legs' goroutines
		var lanes []string // of the call's attempts, as they end
		first := ""        // the lane of the call's first attempt
		hedgedToC := false // c's attempt was the call's hedge
		rt, err := New(Config{Base: base, Observer: &policy.Observer{
			AttemptDone: func(i policy.AttemptInfo) {
				mu.Lock()
				defer mu.Unlock()
				if i.Kind == policy.AttemptFirst {
					first = i.Lane
				}
				if i.Lane == "c:80" && i.Kind == policy.AttemptHedge {
					hedgedToC = true
				}
				lanes = append(lanes, i.Lane)
			},
		}, Policies: policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{},
			Hedge:    &policy.Hedge{Quantile: 0.1, MaxConcurrent: 2, Window: time.Hour},
			Budget:   policy.Budget{Ratio: -1},
			Replicas: &policy.Replicas{Endpoints: Static(four[:3]...), MaxEjected: -1},
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rt.CloseIdleConnections()
			f.net.Close()
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		for i := range 1000 { // the scope's error rate stays low: hedges are healthy
			laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
		}
		refuse.Store(true)
		f.reps["b"].status.Store(http.StatusServiceUnavailable)
		for _, r := range f.reps {
			r.slowFirst.Store(int64(50 * time.Millisecond))
		}
		abc := 0 // calls whose attempts went a, then b, and c
		for i := range 300 {
			time.Sleep(3 * time.Second)
			// The threshold follows the latency up: once the slow first
			// arrivals are the key's latency in the last periods, it
			// passes b's 50ms, and c's attempt is a retry (which
			// TestAnUnsentAttemptLeavesAttemptsToTheCallsOtherRetries
			// covers); the calls here are those a hedge can serve.
			if rt.Measured("api").HedgeThreshold >= 50*time.Millisecond {
				break
			}
			mu.Lock()
			lanes, first, hedgedToC = nil, "", false
			mu.Unlock()
			code, err := laneGet(t, rt, "http://api/", strconv.Itoa(i))
			synctest.Wait() // the loser's attempt ends
			mu.Lock()
			fromA, went, hedged := first == "a:80", slices.Clone(lanes), hedgedToC
			mu.Unlock()
			if !fromA {
				continue
			}
			if err != nil || code != 200 {
				t.Errorf("call %d: %d through %v, %v", i, code, went, err)
			}
			f.mu.Lock()
			bc := slices.Equal(f.calls[strconv.Itoa(i)], []string{"b", "c"})
			f.mu.Unlock()
			if bc {
				abc++
				if !hedged {
					t.Errorf("call %d went a, b, c, and c's attempt was not the round's hedge", i)
				}
			}
		}
		if abc == 0 {
			t.Fatal("no call went a, then b and c: the test tested nothing")
		}
		t.Logf("%d calls went a, then b and c", abc)
	})
}

// TestAnUnsentRetryIsBoundByTheBudgetWhenNoOtherLaneIsOpen: with the
// other lane ejected, the retry of a refused dial draws a token as
// always, and with none left it is not sent.
func TestAnUnsentRetryIsBoundByTheBudgetWhenNoOtherLaneIsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		// Neither a:80 nor b:80 is served.
		log := &attemptLog{}
		rt := newLaneTransport(t, f, Config{Observer: log.observer(), Policies: policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{},
			Budget:   budgetKeptEmpty,
			Replicas: &policy.Replicas{Endpoints: Static(four[:2]...), ConsecutiveFailures: 1},
		}})
		prime(t, rt, "http://api/")
		emptyBudget(rt, "api")
		// The first call ejects one lane (at most one of two may be),
		// and its unsent retry goes to the other, free.
		if _, _, err := lanePost(t, rt, "http://api/", "1"); err == nil {
			t.Fatal("a call to two refusing replicas succeeded")
		}
		log.mu.Lock()
		log.attempts, log.skips = nil, nil
		log.mu.Unlock()
		if _, _, err := lanePost(t, rt, "http://api/", "2"); err == nil {
			t.Fatal("a call to two refusing replicas succeeded")
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.attempts) != 1 || len(log.skips) != 1 || log.skips[0].Reason != policy.SkipBudget {
			t.Errorf("with no other lane open and no token: attempts %v, skips %+v; want one attempt, its retry skipped for the budget", log.reasons(), log.skips)
		}
	})
}

// TestAReplicasRetryAfterDoesNotBenchTheCall: a 503's Retry-After is the
// replica's that sent it. With another lane open, the call's retry goes
// there after the backoff of any failure, not after the Retry-After.
func TestAReplicasRetryAfterDoesNotBenchTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{}, // BaseDelay 50ms
			Budget:   policy.Budget{Ratio: -1},
			Replicas: &policy.Replicas{Endpoints: Static(four...), ConsecutiveFailures: -1},
		}})
		prime(t, rt, "http://api/")
		d := f.reps["d"]
		d.retryAfter.Store("1")
		d.status.Store(http.StatusServiceUnavailable)
		var slowest time.Duration
		for i := range 300 {
			time.Sleep(10 * time.Millisecond)
			start := time.Now()
			if code, err := laneGet(t, rt, "http://api/", strconv.Itoa(i)); err != nil || code != 200 {
				t.Fatalf("call %d: %d, %v", i, code, err)
			}
			slowest = max(slowest, time.Since(start))
		}
		if d.hits.Load() == 0 {
			t.Fatal("no call reached the replica that pushes back: the test tested nothing")
		}
		if slowest >= 100*time.Millisecond {
			t.Errorf("with %d calls pushed back by one replica, the slowest call took %v, want under the backoff's 50ms ceiling and well under its Retry-After", d.hits.Load(), slowest)
		}
	})
}

// TestRetryAfterBoundsTheRetryWhenNoOtherLaneIsOpen: every replica pushes
// back. Each retry goes to a lane the call has not used, after the
// backoff; only the last, with every lane used, waits the Retry-After.
func TestRetryAfterBoundsTheRetryWhenNoOtherLaneIsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 5,
			Retry:    &policy.Retry{BaseDelay: 10 * time.Millisecond},
			Budget:   policy.Budget{Ratio: -1},
			Replicas: &policy.Replicas{Endpoints: Static(four...), ConsecutiveFailures: -1},
		}})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.retryAfter.Store("1")
			r.status.Store(http.StatusServiceUnavailable)
		}
		start := time.Now()
		code, err := laneGet(t, rt, "http://api/", "all")
		took := time.Since(start)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("%d, %v; want the last 503", code, err)
		}
		if reached := f.calls["all"]; len(reached) != 5 {
			t.Fatalf("the call reached %v, want five attempts", reached)
		}
		// Three backoffs of at most 10, 20 and 40 ms, then the
		// Retry-After's second (at least, as a backoff of 80 ms may be
		// longer than what is left of it).
		if took < time.Second || took > time.Second+200*time.Millisecond {
			t.Errorf("five attempts on four pushing-back replicas took %v, want one Retry-After (1s) and three short backoffs", took)
		}
	})
}

// pushOnce is a replica that answers its first request 503 with
// Retry-After: 5 and, when ms is set, Resilix-Retry-After-Ms: ms, and
// every other 200.
type pushOnce struct {
	ms     string
	hits   atomic.Int64
	pushed atomic.Bool
}

func (p *pushOnce) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.hits.Add(1)
	if p.pushed.CompareAndSwap(false, true) {
		w.Header().Set("Retry-After", "5")
		if p.ms != "" {
			w.Header().Set("Resilix-Retry-After-Ms", p.ms)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// TestALaneIsHeldForWhatTheServerMeans: a server's Resilix-Retry-After-Ms
// says how long its Retry-After's whole seconds mean; the lane is held
// back that long, not the Retry-After's 5 s.
func TestALaneIsHeldForWhatTheServerMeans(t *testing.T) {
	for _, tt := range []struct {
		ms   string
		held time.Duration // how long the lane gets no attempt, at least
		back time.Duration // by when it has its share again
	}{
		{"", 4 * time.Second, 6 * time.Second},
		{"100", 0, time.Second},
	} {
		t.Run("ms="+tt.ms, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				f.serve("api:80", "own")
				for _, a := range four[:3] {
					f.serve(a, a[:1])
				}
				d := &pushOnce{ms: tt.ms}
				f.net.Listen(four[3], d)
				rt := newLaneTransport(t, f, Config{Policies: policy.Set{
					Replicas: &policy.Replicas{Endpoints: Static(four...), ConsecutiveFailures: -1},
				}})
				prime(t, rt, "http://api/")
				start := time.Now()
				for d.hits.Load() == 0 {
					time.Sleep(10 * time.Millisecond)
					laneGet(t, rt, "http://api/", "")
				}
				pushed := time.Since(start)
				var returned time.Duration
				for returned == 0 && time.Since(start) < 8*time.Second {
					time.Sleep(10 * time.Millisecond)
					laneGet(t, rt, "http://api/", "")
					if d.hits.Load() > 1 {
						returned = time.Since(start) - pushed
					}
				}
				if returned == 0 || returned < tt.held || returned > tt.back {
					t.Errorf("the lane that pushed back had its next attempt %v after (0: none in 8s), want in [%v, %v]", returned, tt.held, tt.back)
				}
			})
		})
	}
}

// everyOther is a replica that answers every other request 503 with
// Retry-After: 1 and Resilix-Retry-After-Ms: 50, and the others 200.
type everyOther struct{ n atomic.Int64 }

func (e *everyOther) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if e.n.Add(1)%2 == 1 {
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Resilix-Retry-After-Ms", "50")
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// TestARetryWaitsForTheFirstLaneToOpen: when every lane the call has not
// used is held back, its retry waits for the first of them to open, if
// that comes before the Retry-After of the replica that answered it,
// rather than the whole Retry-After.
func TestARetryWaitsForTheFirstLaneToOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.net.Listen(four[0], &everyOther{})
		f.net.Listen(four[1], &everyOther{})
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{BaseDelay: time.Millisecond},
			Budget:   policy.Budget{Ratio: -1},
			Replicas: &policy.Replicas{Endpoints: Static(four[:2]...), ConsecutiveFailures: -1},
		}})
		prime(t, rt, "http://api/")
		var slowest time.Duration
		waited := 0 // calls that waited for a held lane
		for i := range 200 {
			time.Sleep(10 * time.Millisecond)
			start := time.Now()
			laneGet(t, rt, "http://api/", strconv.Itoa(i))
			took := time.Since(start)
			slowest = max(slowest, took)
			if took >= 20*time.Millisecond {
				waited++
			}
		}
		if waited == 0 {
			t.Fatal("no call found every other lane held: the test tested nothing")
		}
		if slowest > 100*time.Millisecond {
			t.Errorf("%d calls found the other lane held; the slowest took %v, want the hold's 50ms, not the Retry-After's 1s", waited, slowest)
		}
	})
}
