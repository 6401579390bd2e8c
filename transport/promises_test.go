package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// The tests in this file each hold one promise of the package doc on a
// path an attacker of the transport would try first.

// stallBody is a response body whose reads block until it is closed, as a
// server that sent headers and then went quiet.
type stallBody struct {
	closed chan struct{}
	once   sync.Once
}

func newStallBody() *stallBody { return &stallBody{closed: make(chan struct{})} }

func (b *stallBody) Read([]byte) (int, error) {
	<-b.closed
	return 0, io.ErrClosedPipe
}

func (b *stallBody) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

func (b *stallBody) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// TestHedgedRoundLeavesNoGoroutineBehind: a slow first leg while every
// hedge fails at once. Failed legs free their place, so the round keeps
// starting hedges, up to Attempts − 1 of them: more than MaxConcurrent. No
// leg may outlive the call, whatever their number.
func TestHedgedRoundLeavesNoGoroutineBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			switch {
			case i < 30:
				return time.Millisecond, 200
			case i == 30:
				return 300 * time.Millisecond, 200
			}
			return 0, 503
		}}
		set := policy.Set{
			Attempts: 8,
			Hedge:    &policy.Hedge{MaxConcurrent: 3, MinSamples: 5, Quantile: 0.5},
			Budget:   policy.Budget{Ratio: -1},
		}
		tr := mustNew(t, Config{Base: base, Policies: set})
		warm(t, tr, 30)
		code, err := do(t, t.Context(), tr)
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want the slow first leg's 200", code, err)
		}
		synctest.Wait()
		if n := base.calls.Load(); n != 30+8 {
			t.Errorf("%d wire calls, want the 8 attempts", n-30)
		}
		// A leg left blocked would make the bubble panic as it ends,
		// naming it.
	})
}

// TestStalledBodyDoesNotDelayTheRetry: a 503 whose body never ends must
// not hold the caller: the retry goes, and the 200 comes back at once.
func TestStalledBodyDoesNotDelayTheRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stalled *stallBody
		var n atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				stalled = newStallBody()
				resp := respond(r, 503)
				resp.Body = stalled
				return resp, nil
			}
			return respond(r, 200), nil
		})
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		code, err := do(t, ctx, tr)
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want the retry's 200", code, err)
		}
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("the call took %v: the stalled body held it", d)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !stalled.isClosed() {
			t.Fatal("the superseded body was never closed")
		}
	})
}

// TestStalledFailedLegDoesNotHoldTheWinner: in a hedged round, a failed
// leg whose body stalls must not keep the winner from the caller.
func TestStalledFailedLegDoesNotHoldTheWinner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stalled atomic.Pointer[stallBody]
		var n atomic.Int64
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			i := n.Add(1) - 1
			d, code := 10*time.Millisecond, 200
			switch {
			case i == 30: // the first leg fails slowly, with a body that stalls
				d, code = 100*time.Millisecond, 503
			case i == 31: // the hedge answers after the first leg failed
				d = 140 * time.Millisecond
			}
			if !timing.Sleep(r.Context(), d) {
				return nil, r.Context().Err()
			}
			resp := respond(r, code)
			if i == 30 {
				b := newStallBody()
				stalled.Store(b)
				resp.Body = b
			}
			return resp, nil
		})
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet()})
		warm(t, tr, 30)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		code, err := do(t, ctx, tr)
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want the hedge's 200", code, err)
		}
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Fatalf("the call took %v: the failed leg's stalled body held the winner", d)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !stalled.Load().isClosed() {
			t.Fatal("the failed leg's body was never closed")
		}
	})
}

// TestRefusedRetryReturnsTheUpstreamAnswer: when a gate refuses the
// retry, the caller gets the upstream's last answer, body and all, and the
// observer hears why the retry was not sent.
func TestRefusedRetryReturnsTheUpstreamAnswer(t *testing.T) {
	const answer = `{"error":"maintenance"}`
	for _, tc := range []struct {
		name string
		set  func(*policy.Set)
		gate policy.Gate
	}{
		{"breaker", func(s *policy.Set) { s.Breaker = &policy.Breaker{ConsecutiveFailures: 1} }, policy.GateBreaker},
		{"rate limit", func(s *policy.Set) { s.RateLimit = &policy.RateLimit{PerSecond: 0.001, Burst: 1} }, policy.GateRateLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := fakeRT(func(r *http.Request) (*http.Response, error) {
				resp := respond(r, 503)
				resp.Body = &body{Reader: strings.NewReader(answer)}
				return resp, nil
			})
			set := retrySet()
			tc.set(&set)
			var skips []policy.RetrySkip
			tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
				RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
			}})
			resp, err := get(t, t.Context(), tr, "http://a.test/")
			if err != nil {
				t.Fatalf("err %v; want the upstream's 503", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || string(b) != answer {
				t.Fatalf("got %d %q; want 503 %q", resp.StatusCode, b, answer)
			}
			if len(skips) != 1 || skips[0].Reason != policy.SkipGate || skips[0].Gate != tc.gate {
				t.Fatalf("skips %+v; want one, by the %v gate", skips, tc.gate)
			}
		})
	}
}

// TestRetryInheritsTheBulkheadSlot: the response a retry may supersede
// holds a bulkhead slot until it is thrown away; with one slot the retry
// must take it over rather than be refused by its own call.
func TestRetryInheritsTheBulkheadSlot(t *testing.T) {
	base := &script{codes: []int{503, 200}}
	set := retrySet()
	set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 1}
	tr := mustNew(t, Config{Base: base, Policies: set})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v, %v; want the retry's 200", resp, err)
	}
	if got := tr.Measured("a.test").BulkheadInFlight; got != 1 {
		t.Fatalf("%d slots held while the body is open, want 1", got)
	}
	resp.Body.Close()
	if got := tr.Measured("a.test").BulkheadInFlight; got != 0 {
		t.Fatalf("%d slots held after close, want 0", got)
	}
}

// TestPanickingBaseReleasesWhatItHeld: a caller that recovers a panic from
// the base (as net/http's server does) must find the gates as they were.
func TestPanickingBaseReleasesWhatItHeld(t *testing.T) {
	var n atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		if n.Add(1) == 1 {
			panic("base bug")
		}
		return respond(r, 200), nil
	})
	set := policy.Set{
		Bulkhead: &policy.Bulkhead{MaxConcurrent: 1},
		Limiter:  &policy.Limiter{InitialLimit: 1, MinLimit: 1, MaxLimit: 1},
		Breaker:  &policy.Breaker{},
		Timeout:  &policy.Timeout{PerAttempt: time.Second},
	}
	tr := mustNew(t, Config{Base: base, Policies: set})
	func() {
		defer func() {
			if p := recover(); p != "base bug" {
				t.Fatalf("recovered %v, want the base's panic", p)
			}
		}()
		_, _ = get(t, t.Context(), tr, "http://a.test/")
	}()
	m := tr.Measured("a.test")
	if m.BulkheadInFlight != 0 || m.LimiterInFlight != 0 {
		t.Fatalf("after the panic: bulkhead %d, limiter %d in flight; want 0", m.BulkheadInFlight, m.LimiterInFlight)
	}
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatalf("the call after a recovered panic: %v", err)
	}
	resp.Body.Close()
}

// TestHedgeLegPanicReachesTheCaller: a panic on a hedge leg's goroutine is
// re-raised on the caller's, after the round's other legs are cancelled
// and their bodies closed; nothing is left holding a permit.
func TestHedgeLegPanicReachesTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
			switch {
			case i < 30:
				return 10 * time.Millisecond, 200
			case i == 30:
				return 200 * time.Millisecond, 200
			case i == 31:
				panic(fmt.Sprintf("hedge leg %d", i))
			}
			return 10 * time.Millisecond, 200
		}}
		set := hedgeSet()
		set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 4}
		tr := mustNew(t, Config{Base: base, Policies: set})
		warm(t, tr, 30)
		func() {
			defer func() {
				p := recover()
				if p == nil || !strings.Contains(fmt.Sprint(p), "hedge leg 31") {
					t.Fatalf("recovered %v, want the hedge leg's panic", p)
				}
			}()
			_, _ = do(t, t.Context(), tr)
		}()
		synctest.Wait()
		if err := context.Cause(base.ctxs[30]); err == nil {
			t.Fatal("the first leg was not cancelled")
		}
		if got := tr.Measured("up.test").BulkheadInFlight; got != 0 {
			t.Fatalf("%d bulkhead slots held after the panic", got)
		}
		if code, err := do(t, t.Context(), tr); err != nil || code != 200 {
			t.Fatalf("the next call: %d, %v", code, err)
		}
	})
}

// TestLoserDoesNotTouchTheRequestAfterClose: net/http lets a caller reuse
// its request once the response body is closed. A hedge leg still inside a
// base that is slow to notice cancellation must not be reading it then
// (the race detector is the judge).
func TestLoserDoesNotTouchTheRequestAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			i := n.Add(1) - 1
			d := 10 * time.Millisecond
			switch {
			case i == 30:
				d = 30 * time.Millisecond // the first leg wins, after the hedge started
			case i == 31:
				time.Sleep(100 * time.Millisecond) // deaf to cancellation for a while
				_ = r.Header.Get("X-Trace")
				_ = r.URL.String()
				return nil, r.Context().Err()
			}
			time.Sleep(d)
			return respond(r, 200), nil
		})
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet()})
		warm(t, tr, 30)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://up.test/", nil)
		req.Header.Set("X-Trace", "1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		req.Header.Set("X-Trace", "2") // reuse, as net/http allows
		req.URL.Path = "/again"
		time.Sleep(time.Second)
		synctest.Wait()
	})
}

// TestGateWaitEndedByTheCallerIsNotARefusal: the caller's own
// cancellation while a gate makes it wait comes back as the context's
// error, outcome Canceled, and is not counted as a refusal.
func TestGateWaitEndedByTheCallerIsNotARefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  policy.Set
	}{
		{"bulkhead", policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 1, MaxWait: time.Minute}}},
		{"rate limit", policy.Set{RateLimit: &policy.RateLimit{PerSecond: 0.1, Burst: 1, MaxWait: time.Minute}}},
		{"limiter", policy.Set{Limiter: &policy.Limiter{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var n atomic.Int32
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					if n.Add(1) == 1 {
						<-release // holds the slot, the permit or the token
					}
					return respond(r, 200), nil
				})
				var mu sync.Mutex
				var refused int
				var outcomes []policy.Outcome
				tr := mustNew(t, Config{Base: base, Policies: tc.set, Observer: &policy.Observer{
					Refused: func(policy.Refusal) { mu.Lock(); refused++; mu.Unlock() },
					CallDone: func(c policy.CallInfo) {
						mu.Lock()
						outcomes = append(outcomes, c.Outcome)
						mu.Unlock()
					},
				}})
				held := make(chan struct{})
				go func() {
					defer close(held)
					if resp, err := get(t, t.Context(), tr, "http://a.test/"); err == nil {
						resp.Body.Close()
					}
				}()
				synctest.Wait()
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(time.Second, cancel)
				_, err := get(t, ctx, tr, "http://a.test/")
				close(release)
				<-held
				if !errors.Is(err, context.Canceled) || errors.Is(err, policy.ErrRejected) {
					t.Fatalf("err %v; want the caller's cancellation, not a refusal", err)
				}
				mu.Lock()
				defer mu.Unlock()
				if refused != 0 || outcomes[0] != policy.Canceled {
					t.Fatalf("%d refusals, outcome %v; want none and canceled", refused, outcomes[0])
				}
			})
		})
	}
}

// TestLegIsEvidenceOrDiscardedNeverBoth: a hedge leg that answers just as
// its round is won must be either taught to the gates with its outcome or
// discarded, and reported once, as one or the other.
func TestLegIsEvidenceOrDiscardedNeverBoth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			i := n.Add(1) - 1
			d, code := 10*time.Millisecond, 200
			switch {
			case i == 30:
				d = 40 * time.Millisecond
			case i == 31:
				d, code = 0, 503 // the hedge answers at once, with a failure
			}
			time.Sleep(d)
			resp := respond(r, code)
			resp.Header.Set("Leg", fmt.Sprint(i))
			return resp, nil
		})
		won := make(chan struct{})
		var classified atomic.Int32
		classify := func(resp *http.Response, err error) policy.Outcome {
			if resp != nil && resp.Header.Get("Leg") == "31" {
				classified.Add(1)
				// Hold the hedge's classification until the first leg
				// has won: the window in which a leg that already
				// answered is chosen as a loser.
				select {
				case <-won:
				case <-time.After(time.Second):
				}
			}
			return policy.DefaultClassify(resp, err)
		}
		var mu sync.Mutex
		var hedgeEvents []policy.AttemptInfo
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{MaxConcurrent: 2}, Classify: classify}, Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				mu.Lock()
				defer mu.Unlock()
				if a.Kind == policy.AttemptHedge {
					hedgeEvents = append(hedgeEvents, a)
				}
				if a.Kind == policy.AttemptFirst && a.Outcome == policy.Success && a.Attempt == 1 {
					select {
					case <-won:
					default:
						close(won)
					}
				}
			},
		}})
		warm(t, tr, 30)
		hedgeEvents = nil
		won = make(chan struct{})
		if code, err := do(t, t.Context(), tr); err != nil || code != 200 {
			t.Fatalf("got %d, %v", code, err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(hedgeEvents) != 1 {
			t.Fatalf("the hedge leg was reported %d times: %+v", len(hedgeEvents), hedgeEvents)
		}
		discarded := hedgeEvents[0].Outcome == policy.Discarded
		if taught := classified.Load() == 1; discarded == taught {
			t.Fatalf("the hedge leg: discarded=%v, taught=%v; want exactly one", discarded, taught)
		}
	})
}

// TestFirstRetryBacksOffBaseDelay: the backoff's exponent is the number of
// retries so far, not the wire calls: after a hedged round of two legs,
// the first retry still waits at most BaseDelay.
func TestFirstRetryBacksOffBaseDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		legs := map[string]int{}
		var failedAt, retriedAt time.Time
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			id := r.Header.Get("Call")
			if id == "" { // warming up
				time.Sleep(10 * time.Millisecond)
				return respond(r, 200), nil
			}
			mu.Lock()
			leg := legs[id]
			legs[id]++
			mu.Unlock()
			if leg >= 2 { // the retry
				mu.Lock()
				retriedAt = time.Now()
				mu.Unlock()
				return respond(r, 200), nil
			}
			time.Sleep(50 * time.Millisecond) // both legs of the first round fail slowly
			mu.Lock()
			failedAt = time.Now()
			mu.Unlock()
			return respond(r, 503), nil
		})
		set := policy.Set{
			Attempts: 4,
			Retry:    &policy.Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Second},
			// The median stays at the warm-up's 10ms, in the window and
			// in the last seconds alike: three warm-up calls before each
			// call outnumber its two 50ms legs, so the first round
			// always hedges.
			Hedge:  &policy.Hedge{Quantile: 0.5, MaxConcurrent: 2},
			Budget: policy.Budget{Ratio: -1},
		}
		var ev hedgeEvents
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
		warm(t, tr, 100)
		for i := range 20 {
			warm(t, tr, 3)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://up.test/", nil)
			req.Header.Set("Call", fmt.Sprint(i))
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("got %v, %v", resp, err)
			}
			resp.Body.Close()
			mu.Lock()
			wait, legs := retriedAt.Sub(failedAt), legs[fmt.Sprint(i)]
			mu.Unlock()
			if legs != 3 {
				t.Fatalf("%d wire calls, want a hedged round of 2 and one retry", legs)
			}
			if s, _ := ev.counts(); s != i+1 {
				t.Fatalf("%d hedges after %d calls: the first round must be hedged", s, i+1)
			}
			if wait > 100*time.Millisecond {
				t.Fatalf("the first retry waited %v, more than BaseDelay", wait)
			}
		}
	})
}

// upgraded is a 101 body: readable, writable, half-closable.
type upgraded struct {
	io.Reader
	closedWrite atomic.Bool
}

func (u *upgraded) Write(p []byte) (int, error) { return len(p), nil }
func (u *upgraded) Close() error                { return nil }
func (u *upgraded) CloseWrite() error           { u.closedWrite.Store(true); return nil }

// TestUpgradedBodyKeepsCloseWrite: httputil.ReverseProxy half-closes an
// upgraded connection through CloseWrite; the wrapper must keep it.
func TestUpgradedBodyKeepsCloseWrite(t *testing.T) {
	up := &upgraded{Reader: strings.NewReader("")}
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusSwitchingProtocols, Header: http.Header{}, Body: up, Request: r}, nil
	})
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{
		Timeout:  &policy.Timeout{PerAttempt: time.Second},
		Bulkhead: &policy.Bulkhead{MaxConcurrent: 1},
	}})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, ok := resp.Body.(io.ReadWriteCloser); !ok {
		t.Fatal("the upgraded body is no longer writable")
	}
	cw, ok := resp.Body.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the upgraded body lost CloseWrite")
	}
	if err := cw.CloseWrite(); err != nil || !up.closedWrite.Load() {
		t.Fatalf("CloseWrite: %v, reached the connection: %v", err, up.closedWrite.Load())
	}
}
