package transport

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/policy"
)

// invalidKinds are requests net/http's transport refuses to send, before
// it dials: each is a GET of up.test with one change.
var invalidKinds = []struct {
	name   string
	change func(*http.Request)
}{
	{"unsupported scheme", func(r *http.Request) { r.URL.Scheme = "ftp" }},
	{"invalid header field name", func(r *http.Request) { r.Header["Bad Name"] = []string{"v"} }},
	{"invalid header field value", func(r *http.Request) { r.Header.Set("X-Value", "a\r\nInjected: 1") }},
	{"invalid trailer", func(r *http.Request) { r.Trailer = http.Header{"Bad:Name": {"v"}} }},
	{"invalid method", func(r *http.Request) { r.Method = "GET /x" }},
	{"no Host in the URL", func(r *http.Request) { r.URL.Host = "" }},
}

// invalidGet returns a GET of target with change made to it.
func invalidGet(t *testing.T, target string, change func(*http.Request)) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	change(req)
	return req
}

// askedSet is every policy a request net/http refuses could teach, with
// Attempts to spare, and Classify and Retry.If counting the errors they
// are asked about.
func askedSet(asked *atomic.Int64) policy.Set {
	return policy.Set{
		Attempts: 3,
		Classify: func(resp *http.Response, err error) policy.Outcome {
			if err != nil {
				asked.Add(1)
			}
			return policy.DefaultClassify(resp, err)
		},
		Retry: &policy.Retry{
			Delay: func(int) time.Duration { return 10 * time.Millisecond },
			If: func(resp *http.Response, err error) bool {
				if err != nil {
					asked.Add(1)
				}
				return policy.DefaultClassify(resp, err) == policy.Failure
			},
		},
		Hedge:     &policy.Hedge{},
		Breaker:   &policy.Breaker{},
		Throttler: &policy.Throttler{},
		Limiter:   &policy.Limiter{},
	}
}

// callLog records what an observer saw of calls, attempts, skipped
// retries and hedges.
type callLog struct {
	mu       sync.Mutex
	calls    []policy.CallInfo
	attempts []policy.AttemptInfo
	skips    []policy.RetrySkip
	hedges   int
}

func (l *callLog) observer() *policy.Observer {
	return &policy.Observer{
		CallDone:     func(i policy.CallInfo) { l.mu.Lock(); l.calls = append(l.calls, i); l.mu.Unlock() },
		AttemptDone:  func(i policy.AttemptInfo) { l.mu.Lock(); l.attempts = append(l.attempts, i); l.mu.Unlock() },
		RetrySkipped: func(s policy.RetrySkip) { l.mu.Lock(); l.skips = append(l.skips, s); l.mu.Unlock() },
		HedgeStarted: func(policy.HedgeInfo) { l.mu.Lock(); l.hedges++; l.mu.Unlock() },
	}
}

func (l *callLog) reset() {
	l.mu.Lock()
	l.calls, l.attempts, l.skips, l.hedges = nil, nil, nil, 0
	l.mu.Unlock()
}

// TestInvalidRequestIsNoOutcome: a request net/http's transport refuses
// to send as it is (cleanhttp's, through every policy) is sent once, in a
// hedged round once the window is warm, which ends as the refusal comes
// back; its error comes back as net/http gave it, and no policy learns
// from it: 50
// of them leave the breaker closed with no failures, no pressure, the
// limit and the budget as they were, Classify and Retry.If unasked, and
// the latency window still hedging a slow call.
func TestInvalidRequestIsNoOutcome(t *testing.T) {
	const calls = 50
	for _, kind := range invalidKinds {
		t.Run(kind.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				wire := cleanhttp.DefaultPooledTransport()
				defer wire.CloseIdleConnections()
				var slow atomic.Int64 // the next valid call's latency, when set
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					if r.Header.Get("Valid") == "" {
						return wire.RoundTrip(r)
					}
					d := 10 * time.Millisecond
					if n := slow.Swap(0); n != 0 {
						d = time.Duration(n)
					}
					return respondAfter(r, d)
				})
				var asked atomic.Int64
				var log callLog
				tr := mustNew(t, Config{
					Base:     base,
					Policies: askedSet(&asked),
					Observer: log.observer(),
					Key:      func(*http.Request) string { return "up" },
				})
				valid := func() {
					t.Helper()
					req := invalidGet(t, "http://up.test/", func(r *http.Request) { r.Header.Set("Valid", "1") })
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				for range 100 {
					valid()
				}
				before := tr.Measured("up")
				log.reset()

				bare, err := (&http.Transport{}).RoundTrip(invalidGet(t, "http://up.test/", kind.change))
				if err == nil {
					bare.Body.Close()
					t.Fatal("net/http sent it")
				}
				start := time.Now()
				for range calls {
					resp, got := tr.RoundTrip(invalidGet(t, "http://up.test/", kind.change))
					if resp != nil {
						resp.Body.Close()
						t.Fatalf("got a response, %d", resp.StatusCode)
					}
					if got == nil || got.Error() != err.Error() {
						t.Fatalf("err %v; want net/http's %q", got, err)
					}
				}
				if d := time.Since(start); d != 0 {
					t.Errorf("the calls took %v; want no backoff, no hedge wait", d)
				}
				synctest.Wait()

				log.mu.Lock()
				done, attempts, skips, hedges := log.calls, log.attempts, log.skips, log.hedges
				log.mu.Unlock()
				if len(attempts) != calls || len(done) != calls {
					t.Errorf("%d attempts and %d calls done for %d calls; want one each", len(attempts), len(done), calls)
				}
				for _, a := range attempts {
					if a.Kind != policy.AttemptFirst || a.Attempt != 1 || a.Outcome != policy.Invalid {
						t.Fatalf("attempt %d, %v, %v; want only first attempts, invalid", a.Attempt, a.Kind, a.Outcome)
					}
				}
				for _, c := range done {
					if c.Outcome != policy.Invalid || c.WireAttempts != 1 || c.Err == nil || c.Err.Error() != err.Error() {
						t.Fatalf("call %v after %d attempts, err %v; want invalid after one, net/http's error", c.Outcome, c.WireAttempts, c.Err)
					}
				}
				if len(skips) != 0 || hedges != 0 {
					t.Errorf("retries skipped %+v, %d hedges; want none of either", skips, hedges)
				}
				if n := asked.Load(); n != 0 {
					t.Errorf("Classify and Retry.If were asked %d times about the refusal", n)
				}
				after := tr.Measured("up")
				if after.BreakerState != policy.BreakerClosed || after.ErrorRate != 0 {
					t.Errorf("breaker %v, error rate %v; want closed with no failures", after.BreakerState, after.ErrorRate)
				}
				if after.Pressure != 0 || after.LimiterInFlight != 0 || after.LimiterLimit != before.LimiterLimit {
					t.Errorf("pressure %v, limiter %d in flight of %d; want 0, 0 of %d",
						after.Pressure, after.LimiterInFlight, after.LimiterLimit, before.LimiterLimit)
				}
				if after.BudgetBalance != before.BudgetBalance {
					t.Errorf("budget %v, was %v", after.BudgetBalance, before.BudgetBalance)
				}

				// The window and the hedging gates are as the valid calls
				// left them: a slow call is hedged.
				slow.Store(int64(time.Second))
				valid()
				log.mu.Lock()
				hedges = log.hedges
				log.mu.Unlock()
				if hedges != 1 {
					t.Errorf("a slow call after the refusals: %d hedges; want 1", hedges)
				}
			})
		})
	}
}

// TestInvalidRequestOverLoopback: a request net/http refuses once it has
// a connection, an invalid Host over HTTP/2, is sent once through every
// policy, and the breaker learns nothing from it; the server never sees a
// request. (Over HTTP/1 net/http's own refusals once connected race with
// the read of the connection they close, and come back either way; over
// HTTP/2 the stream is refused before the connection is touched.)
func TestInvalidRequestOverLoopback(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { seen.Add(1) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	wire := cleanhttp.DefaultPooledTransport()
	wire.TLSClientConfig = &tls.Config{RootCAs: roots}
	defer wire.CloseIdleConnections()
	var asked atomic.Int64
	var log callLog
	tr := mustNew(t, Config{Base: wire, Policies: askedSet(&asked), Observer: log.observer()})
	badHost := func(r *http.Request) { r.Host = "a b" }

	bareRT := &http.Transport{TLSClientConfig: wire.TLSClientConfig, ForceAttemptHTTP2: true}
	defer bareRT.CloseIdleConnections()
	bare, err := bareRT.RoundTrip(invalidGet(t, srv.URL, badHost))
	if err == nil {
		bare.Body.Close()
		t.Fatal("net/http sent it")
	}
	for range 20 {
		_, got := tr.RoundTrip(invalidGet(t, srv.URL, badHost))
		if got == nil || got.Error() != err.Error() {
			t.Fatalf("err %v; want net/http's %q", got, err)
		}
	}
	log.mu.Lock()
	attempts, skips := len(log.attempts), len(log.skips)
	for _, a := range log.attempts {
		if a.Outcome != policy.Invalid {
			t.Errorf("attempt %d: %v; want invalid", a.Attempt, a.Outcome)
		}
	}
	log.mu.Unlock()
	key := srv.Listener.Addr().String()
	if m := tr.Measured(key); attempts != 20 || skips != 0 || m.BreakerState != policy.BreakerClosed || m.ErrorRate != 0 {
		t.Errorf("%d attempts, %d retries skipped, breaker %v at error rate %v; want 20, 0, closed at 0",
			attempts, skips, m.BreakerState, m.ErrorRate)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("Classify and Retry.If were asked %d times about the refusal", n)
	}
	if n := seen.Load(); n != 0 {
		t.Errorf("the server saw %d requests", n)
	}
}

// TestInvalidRequestDepositsNothing: a call whose request net/http
// refuses to send earns no retries for the calls that are: 20 of them
// leave a drawn-down budget where it was.
func TestInvalidRequestDepositsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wire := cleanhttp.DefaultPooledTransport()
		defer wire.CloseIdleConnections()
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("Fail") == "" {
				return wire.RoundTrip(r)
			}
			return respond(r, http.StatusServiceUnavailable), nil
		})
		set := policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{Delay: func(int) time.Duration { return time.Millisecond }},
			Budget:   policy.Budget{Ratio: 0.5, Max: 5, MinPerSecond: -1},
		}
		tr := mustNew(t, Config{Base: base, Policies: set, Key: func(*http.Request) string { return "up" }})
		for range 8 { // each deposits 0.5 and its retry takes 1
			resp, err := tr.RoundTrip(invalidGet(t, "http://up.test/", func(r *http.Request) { r.Header.Set("Fail", "1") }))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		before := tr.Measured("up").BudgetBalance
		if before >= 5 {
			t.Fatalf("budget %v after the failures; want it drawn down", before)
		}
		for range 20 {
			if _, err := tr.RoundTrip(invalidGet(t, "http://up.test/", func(r *http.Request) { r.URL.Scheme = "ftp" })); err == nil {
				t.Fatal("net/http sent it")
			}
		}
		if after := tr.Measured("up").BudgetBalance; after != before {
			t.Errorf("budget %v after the refusals, was %v", after, before)
		}
	})
}

// TestInvalidProbeLeavesTheBreakerHalfOpen: a half-open breaker's probe
// whose request net/http refuses to send neither closes nor reopens it,
// and gives its probe slot back; the next real answer decides.
func TestInvalidProbeLeavesTheBreakerHalfOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		wire := cleanhttp.DefaultPooledTransport()
		defer wire.CloseIdleConnections()
		var failing atomic.Bool
		failing.Store(true)
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("Valid") == "" {
				return wire.RoundTrip(r)
			}
			if failing.Load() {
				return respond(r, http.StatusServiceUnavailable), nil
			}
			return respond(r, http.StatusOK), nil
		})
		set := policy.Set{Breaker: &policy.Breaker{ConsecutiveFailures: 3, OpenFor: time.Second, Probes: 1}}
		tr := mustNew(t, Config{Base: base, Policies: set, Key: func(*http.Request) string { return "up" }})
		valid := func() (*http.Response, error) {
			return tr.RoundTrip(invalidGet(t, "http://up.test/", func(r *http.Request) { r.Header.Set("Valid", "1") }))
		}
		for range 3 {
			resp, err := valid()
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if s := tr.Measured("up").BreakerState; s != policy.BreakerOpen {
			t.Fatalf("breaker %v after 3 failures, want open", s)
		}
		time.Sleep(2 * time.Second) // past OpenFor and its jitter
		failing.Store(false)
		for range 5 {
			_, err := tr.RoundTrip(invalidGet(t, "http://up.test/", func(r *http.Request) { r.URL.Scheme = "ftp" }))
			if err == nil || err.Error() != `unsupported protocol scheme "ftp"` {
				t.Fatalf("err %v; want net/http's refusal, the probe slot free", err)
			}
			if s := tr.Measured("up").BreakerState; s != policy.BreakerHalfOpen {
				t.Fatalf("breaker %v after an invalid probe, want half-open", s)
			}
		}
		resp, err := valid()
		if err != nil {
			t.Fatalf("the real probe: %v", err)
		}
		resp.Body.Close()
		if s := tr.Measured("up").BreakerState; s != policy.BreakerClosed {
			t.Fatalf("breaker %v after a successful probe, want closed", s)
		}
	})
}
