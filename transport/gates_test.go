package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// trackedBody is a request body that records whether it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

func TestRefusalClosesTheBodyAndNeverReachesTheBase(t *testing.T) {
	var reached atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		reached.Add(1)
		return respond(r, 503), nil
	})
	set := policy.Set{Breaker: &policy.Breaker{ConsecutiveFailures: 1}}
	var refusals []policy.Refusal
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		Refused: func(r policy.Refusal) { refusals = append(refusals, r) },
	}})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	b := &trackedBody{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPut, "http://a.test/", b)
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if resp != nil || !errors.Is(err, policy.ErrCircuitOpen) || !errors.Is(err, policy.ErrRejected) {
		t.Fatalf("got %v, %v; want ErrCircuitOpen through http.Client", resp, err)
	}
	var rej *policy.RejectedError
	if !errors.As(err, &rej) || rej.Gate != policy.GateBreaker || rej.Key != "a.test" || rej.RetryAfter <= 0 {
		t.Fatalf("RejectedError %+v", rej)
	}
	if !b.closed.Load() || reached.Load() != 1 {
		t.Fatalf("body closed=%v, base reached %d times; want closed and 1", b.closed.Load(), reached.Load())
	}
	if len(refusals) != 1 || refusals[0].Gate != policy.GateBreaker {
		t.Fatalf("refusals %+v", refusals)
	}
}

func TestAnOpenBreakerIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503}}
		set := retrySet()
		set.Breaker = &policy.Breaker{ConsecutiveFailures: 2}
		tr := mustNew(t, Config{Base: base, Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		// Attempt 1 fails, attempt 2 fails and trips the breaker, attempt
		// 3 is refused: the caller gets the second 503, intact, not the
		// refusal.
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the last 503", resp, err)
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); string(b) != http.StatusText(http.StatusServiceUnavailable) {
			t.Fatalf("body %q, want it intact", b)
		}
		synctest.Wait() // the superseded response is drained in the background
		if base.n() != 2 || !base.resps[0].Body.(*body).closed.Load() {
			t.Fatalf("%d wire calls; the superseded response must be closed", base.n())
		}
	})
}

func TestBulkheadHoldsItsSlotUntilTheBodyIsClosed(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 1}}})
	first, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, t.Context(), tr, "http://a.test/"); !errors.Is(err, policy.ErrBulkheadFull) {
		t.Fatalf("second call while the first body is open: %v, want ErrBulkheadFull", err)
	}
	if got := tr.Measured("a.test").BulkheadInFlight; got != 1 {
		t.Fatalf("in flight %d", got)
	}
	_, _ = io.ReadAll(first.Body) // EOF releases too
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatalf("after EOF: %v", err)
	}
	resp.Body.Close()
	first.Body.Close()
	if got := tr.Measured("a.test").BulkheadInFlight; got != 0 {
		t.Fatalf("in flight %d after every body closed", got)
	}
}

func TestBulkheadWaitEndsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 1, MaxWait: time.Minute}}})
		held, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Body.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err = get(t, ctx, tr, "http://a.test/")
		// The caller's own deadline ended the wait: its error, not a
		// refusal.
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, policy.ErrRejected) || time.Since(start) != 2*time.Second {
			t.Fatalf("err %v after %v; want the caller's deadline at 2s", err, time.Since(start))
		}
	})
}

func TestRateLimitRefusalCarriesRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: 1, Burst: 1}}})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		time.Sleep(time.Second / 4)
		_, err = get(t, t.Context(), tr, "http://a.test/")
		var rej *policy.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, policy.ErrRateLimited) || rej.RetryAfter != time.Second*3/4 {
			t.Fatalf("err %v, want ErrRateLimited with a RetryAfter of 750ms, when the next token is due", err)
		}
		time.Sleep(rej.RetryAfter)
		resp, err = get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatalf("after the RetryAfter: %v", err)
		}
		resp.Body.Close()
	})
}

func TestHedgesPassTheGatesToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, base, ev := warmHedging(t, policy.Set{Hedge: &policy.Hedge{}, Bulkhead: &policy.Bulkhead{MaxConcurrent: 1}})
		base.slowOnce(time.Second)
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		// The bulkhead's one slot is the first leg's: the hedge may not
		// bypass it.
		if s, _ := ev.counts(); s != 0 || ev.reason(policy.HedgeRejected) != 1 {
			t.Fatalf("hedges %d, rejected %d; a hedge must pass the bulkhead like any leg", s, ev.reason(policy.HedgeRejected))
		}
	})
}

// byHost is a base that sends each request to the RoundTripper of its
// URL's host.
type byHost map[string]http.RoundTripper

func (h byHost) RoundTrip(r *http.Request) (*http.Response, error) { return h[r.URL.Host].RoundTrip(r) }

// TestBreakerIsolatesHostsAndRecovers: three 503s open the breaker of one
// host and not the other's; the refusal says how long it lasts, and the
// breaker lets a probe through exactly then, which closes it once the host
// has healed.
func TestBreakerIsolatesHostsAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sick := httptestutil.NewUpstream(httptestutil.Options{Faults: always503})
		well := httptestutil.NewUpstream(httptestutil.Options{})
		tracker := httptestutil.Track(byHost{"sick.test": sick.RoundTripper(), "well.test": well.RoundTripper()})
		const openFor = 50 * time.Millisecond
		set := policy.Set{Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenFor: openFor}}
		tr := mustNew(t, Config{Base: tracker, Policies: set})
		getStatus := func(url string) (int, error) {
			resp, err := get(t, t.Context(), tr, url)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		for range 3 {
			if code, err := getStatus("http://sick.test/"); err != nil || code != 503 {
				t.Fatalf("got %d, %v", code, err)
			}
		}
		_, err := getStatus("http://sick.test/")
		var rej *policy.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, policy.ErrCircuitOpen) {
			t.Fatalf("after 3 failures: %v, want the breaker open", err)
		}
		// An opening lasts OpenFor, jittered up by at most a quarter.
		if rej.RetryAfter < openFor || rej.RetryAfter >= openFor*5/4 {
			t.Fatalf("RetryAfter %v, want in [%v, %v)", rej.RetryAfter, openFor, openFor*5/4)
		}
		if code, err := getStatus("http://well.test/"); err != nil || code != 200 {
			t.Fatalf("the healthy host: %d, %v; one host's open breaker must not refuse another", code, err)
		}

		sick.SetFaults() // the upstream heals
		time.Sleep(rej.RetryAfter - time.Nanosecond)
		if _, err := getStatus("http://sick.test/"); !errors.Is(err, policy.ErrCircuitOpen) {
			t.Fatalf("a nanosecond before the RetryAfter it gave: %v, want the breaker still open", err)
		}
		time.Sleep(time.Nanosecond)
		if code, err := getStatus("http://sick.test/"); err != nil || code != 200 {
			t.Fatalf("at the RetryAfter it gave: %d, %v; want the probe through, and its 200", code, err)
		}
		if st := tr.Measured("sick.test").BreakerState; st != policy.BreakerClosed {
			t.Fatalf("breaker %v after a successful probe", st)
		}
		if st := sick.Stats(); st.Requests != 4 {
			t.Fatalf("the sick host got %d requests, want 4: 3 failures and the probe", st.Requests)
		}
		if tracker.Open() != 0 {
			t.Fatalf("%d bodies open", tracker.Open())
		}
	})
}

// TestLoopbackBreakerIsolatesHosts is the same isolation over real
// sockets, where the keys are two servers' host:port on one address. The
// breaker opens for an hour, so that no stall of the machine can reach its
// end; recovery is tested in virtual time above.
func TestLoopbackBreakerIsolatesHosts(t *testing.T) {
	_, urlSick := loopback(t, httptestutil.Options{Faults: always503})
	_, urlWell := loopback(t, httptestutil.Options{})
	set := policy.Set{Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenFor: time.Hour}}
	tr, tracker := trackedTransport(t, set)
	c := &http.Client{Transport: tr}
	getStatus := func(url string) (int, error) {
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range 3 {
		if code, err := getStatus(urlSick); err != nil || code != 503 {
			t.Fatalf("got %d, %v", code, err)
		}
	}
	if _, err := getStatus(urlSick); !errors.Is(err, policy.ErrCircuitOpen) {
		t.Fatalf("after 3 failures: %v, want the breaker open", err)
	}
	if code, err := getStatus(urlWell); err != nil || code != 200 {
		t.Fatalf("the healthy host: %d, %v; one host's open breaker must not refuse another", code, err)
	}
	if st := tr.Measured(strings.TrimPrefix(urlSick, "http://")).BreakerState; st != policy.BreakerOpen {
		t.Fatalf("the sick host's breaker is %v, want open", st)
	}
	if tracker.Open() != 0 {
		t.Fatalf("%d bodies open", tracker.Open())
	}
}

// TestABreakerDatesSuccessesBySendAndFailuresByAnswer: where the breaker
// is the only policy that learns from when an answer came, and the
// per-attempt timeout holds an attempt to a slice of its window, a success
// is dated by when it was sent and no clock is read at headers (see
// chain.dateBySend). It must still be counted; and a failure, which may
// trip the breaker, is dated by when it came back, so that an opening
// lasts its full OpenFor from the answer that tripped it.
func TestABreakerDatesSuccessesBySendAndFailuresByAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  policy.Set
		want bool
	}{
		{"breaker+timeout", policy.Set{Breaker: &policy.Breaker{Window: 40 * time.Second}, Timeout: &policy.Timeout{PerAttempt: 10 * time.Second}}, true},
		{"timeout over a slice", policy.Set{Breaker: &policy.Breaker{Window: 40 * time.Second}, Timeout: &policy.Timeout{PerAttempt: 11 * time.Second}}, false},
		{"no timeout", policy.Set{Breaker: &policy.Breaker{}}, false},
		{"with a hedge", policy.Set{Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}, Hedge: &policy.Hedge{}}, false},
		{"with a limiter", policy.Set{Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}, Limiter: &policy.Limiter{}}, false},
		{"with a throttler", policy.Set{Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}, Throttler: &policy.Throttler{}}, false},
	} {
		ch, err := compile(tc.set)
		if err != nil {
			t.Fatal(err)
		}
		if ch.dateBySend != tc.want {
			t.Errorf("%s: dateBySend %v, want %v", tc.name, ch.dateBySend, tc.want)
		}
	}

	synctest.Test(t, func(t *testing.T) {
		const (
			latency = 4 * time.Second
			openFor = 8 * time.Second // its jitter, a quarter, is under latency
		)
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(latency)})
		set := policy.Set{
			Breaker: &policy.Breaker{Window: 40 * time.Second, ConsecutiveFailures: 3, MinCalls: 1000, OpenFor: openFor, FirstOpenFor: -1},
			Timeout: &policy.Timeout{PerAttempt: 10 * time.Second},
		}
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: set})
		call := func() (int, error) {
			resp, err := get(t, t.Context(), tr, "http://b.test/")
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		// The scope, and its breaker's window, start with a first call;
		// the rest come windows later, so that a success dated at any
		// time before them would not be counted.
		if code, err := call(); err != nil || code != 200 {
			t.Fatalf("got %d, %v", code, err)
		}
		time.Sleep(100 * time.Second)
		for range 3 {
			if code, err := call(); err != nil || code != 200 {
				t.Fatalf("got %d, %v", code, err)
			}
		}
		up.SetFaults(always503...)
		if code, err := call(); err != nil || code != 503 {
			t.Fatalf("got %d, %v", code, err)
		}
		if got := tr.Measured("b.test").ErrorRate; got != 0.25 {
			t.Fatalf("error rate %v after 3 slow successes and a failure, want 0.25: the successes were not counted", got)
		}
		for range 2 {
			if code, err := call(); err != nil || code != 503 {
				t.Fatalf("got %d, %v", code, err)
			}
		}
		// Three failures in a row: open, for OpenFor (jittered up by at
		// most a quarter) from the answer that tripped it, not from when
		// it was sent, a latency earlier, which would leave less than
		// OpenFor.
		_, err := call()
		var rej *policy.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, policy.ErrCircuitOpen) {
			t.Fatalf("after 3 failures: %v, want the breaker open", err)
		}
		if rej.RetryAfter < openFor || rej.RetryAfter >= openFor*5/4 {
			t.Fatalf("RetryAfter %v, want in [%v, %v): the failure was dated by its send", rej.RetryAfter, openFor, openFor*5/4)
		}
	})
}

// TestAnObserverStillTimesSuccessesDatedBySend: an observer that takes
// attempt latencies needs the time of every answer, so a chain whose
// breaker would date successes by their send reads the clock for it.
func TestAnObserverStillTimesSuccessesDatedBySend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const latency = 4 * time.Second
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(latency)})
		var got []time.Duration
		tr := mustNew(t, Config{
			Base: up.RoundTripper(),
			Policies: policy.Set{
				Breaker: &policy.Breaker{Window: 40 * time.Second},
				Timeout: &policy.Timeout{PerAttempt: 10 * time.Second},
			},
			Observer: &policy.Observer{AttemptDone: func(a policy.AttemptInfo) { got = append(got, a.Latency) }},
		})
		resp, err := get(t, t.Context(), tr, "http://b.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(got) != 1 || got[0] != latency {
			t.Fatalf("attempt latencies %v, want [%v]", got, latency)
		}
	})
}

// TestADoneCallSpendsNothing: a call whose context is already done, or
// whose deadline has passed, is answered with the context's error before
// its key's state is looked up: no wire call, no gate asked, no rate-limit
// token spent, no lease from a shared store, no key created. Its body is
// closed and the Observer hears it as a Canceled call with no wire
// attempt. A live call after three such calls gets the one token of a
// bucket that refills once in ten seconds.
func TestADoneCallSpendsNothing(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := "local"
		if shared {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var wire atomic.Int32
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					wire.Add(1)
					return respond(r, 200), nil
				})
				rl := &policy.RateLimit{PerSecond: 0.1, Burst: 1}
				store := new(memStore)
				if shared {
					rl.Shared, rl.Lease = store, 1
				}
				set := policy.Set{
					Throttler: &policy.Throttler{},
					Breaker:   &policy.Breaker{},
					Limiter:   &policy.Limiter{},
					Bulkhead:  &policy.Bulkhead{MaxConcurrent: 1},
					RateLimit: rl,
					Retry:     &policy.Retry{},
				}
				var calls []policy.CallInfo
				var refusals, attempts int
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
					CallDone:    func(c policy.CallInfo) { calls = append(calls, c) },
					Refused:     func(policy.Refusal) { refusals++ },
					AttemptDone: func(policy.AttemptInfo) { attempts++ },
				}})

				cancelled, cancel := context.WithCancel(t.Context())
				cancel()
				expired, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
				defer cancel2()
				for i, ctx := range []context.Context{cancelled, cancelled, expired} {
					b := &trackedBody{Reader: strings.NewReader("x")}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://a.test/", b)
					resp, err := tr.RoundTrip(req)
					if resp != nil || err != ctx.Err() {
						t.Fatalf("call %d: got %v, %v; want the context's error %v itself", i, resp, err, ctx.Err())
					}
					if !b.closed.Load() {
						t.Errorf("call %d: the body was not closed", i)
					}
				}
				if n := wire.Load(); n != 0 {
					t.Errorf("%d wire calls, want none", n)
				}
				if s := tr.scopes.lookup("a.test"); s != nil || tr.scopes.len() != 0 {
					t.Errorf("%d keys after done calls only, want none", tr.scopes.len())
				}
				if len(store.keys) != 0 {
					t.Errorf("%d asks of the shared store, want none", len(store.keys))
				}
				if refusals != 0 || attempts != 0 {
					t.Errorf("%d refusals, %d attempts reported; want none", refusals, attempts)
				}
				if len(calls) != 3 {
					t.Fatalf("%d calls reported, want 3", len(calls))
				}
				for i, c := range calls {
					if c.Key != "a.test" || c.Outcome != policy.Canceled || c.WireAttempts != 0 || c.Err == nil || c.Priority != shedding.Critical {
						t.Errorf("call %d reported as %+v", i, c)
					}
				}

				resp, err := get(t, t.Context(), tr, "http://a.test/")
				if err != nil {
					t.Fatalf("the live call after them: %v", err)
				}
				resp.Body.Close()
				if n := wire.Load(); n != 1 {
					t.Errorf("%d wire calls, want 1", n)
				}
			})
		})
	}
}
