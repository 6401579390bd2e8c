package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRT is a base RoundTripper made of a func. It honours the contract the
// transport relies on: it closes the request body.
type fakeRT func(*http.Request) (*http.Response, error)

func (f fakeRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		defer r.Body.Close()
	}
	return f(r)
}

// body is a response body that records whether it was closed.
type body struct {
	io.Reader
	closed atomic.Bool
}

func (b *body) Close() error { b.closed.Store(true); return nil }

// respondAfter answers r with a 200 after d, or with its context's error
// when the context ends first, as a base whose server stops work for a
// cancelled request.
func respondAfter(r *http.Request, d time.Duration) (*http.Response, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return respond(r, 200), nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

func respond(r *http.Request, code int, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &http.Response{
		StatusCode: code, Header: h, Request: r,
		Body: &body{Reader: strings.NewReader(http.StatusText(code))},
	}
}

// script answers the n-th call (from 0) with codes[n], repeating the last.
type script struct {
	mu    sync.Mutex
	codes []int
	hdr   []string
	calls []*http.Request
	resps []*http.Response
}

func (s *script) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(s.calls), len(s.codes)-1)
	s.calls = append(s.calls, r)
	resp := respond(r, s.codes[n], s.hdr...)
	s.resps = append(s.resps, resp)
	return resp, nil
}

func (s *script) n() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.calls) }

func mustNew(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func get(t testing.TB, ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

func TestNewNamesTheInvalidField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxKeys: -1}, "transport: MaxKeys must be >= 0"},
		{Config{PriorityHeader: "Bad Header"}, `transport: PriorityHeader "Bad Header"`},
		{Config{TenantHeader: "x:y"}, `transport: TenantHeader "x:y"`},
		{Config{Policies: policy.Set{Attempts: -2}}, "transport: Policies: policy: Attempts must be >= 0"},
		{Config{Policies: policy.Set{Hedge: &policy.Hedge{Quantile: 1.5}}}, "policy: Hedge.Quantile must be in (0, 1)"},
		{Config{Policies: policy.Set{RateLimit: &policy.RateLimit{}}}, "policy: RateLimit.PerSecond must be > 0"},
		{Config{PerKey: map[string]policy.Set{"a:80": {}, "b:80": {Timeout: &policy.Timeout{PerAttempt: -1}}}},
			`transport: PerKey["b:80"]: policy: Timeout.PerAttempt must be >= 0`},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) error = %v, want it to contain %q", tc.cfg, err, tc.want)
		}
	}
}

func TestZeroConfigIsAPlainRoundTripper(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
	}))
	defer srv.Close()
	tr := mustNew(t, Config{})
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" {
		t.Fatalf("body %q", b)
	}
	if m := tr.Measured(strings.TrimPrefix(srv.URL, "http://")); !m.Known || m.HasBudget {
		t.Fatalf("Measured = %+v, want a known key with no budget", m)
	}
}

type idleCloser struct {
	fakeRT
	closed int
}

func (c *idleCloser) CloseIdleConnections() { c.closed++ }

func TestCloseIdleConnectionsReachesTheBase(t *testing.T) {
	base := &idleCloser{}
	tr := mustNew(t, Config{Base: base})
	(&http.Client{Transport: tr}).CloseIdleConnections()
	if base.closed != 1 {
		t.Fatalf("base CloseIdleConnections called %d times, want 1", base.closed)
	}
}

func retrySet() policy.Set {
	return policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
}

func TestRetryUntilSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 502, 200}}
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		resp.Body.Close()
		if base.n() != 3 {
			t.Fatalf("wire calls = %d, want 3", base.n())
		}
		synctest.Wait() // superseded responses are drained in the background
		for i, r := range base.resps[:2] {
			if !r.Body.(*body).closed.Load() {
				t.Errorf("superseded response %d not closed", i)
			}
		}
	})
}

func TestAttemptsRunOutOnAResponse(t *testing.T) {
	base := &script{codes: []int{503}}
	tr := mustNew(t, Config{Base: base, Policies: retrySet()})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v; want the last 503 and no error", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "Service Unavailable" || base.n() != 3 {
		t.Fatalf("body %q after %d calls", b, base.n())
	}
}

func TestAttemptsRunOutOnAnError(t *testing.T) {
	var n atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		return nil, errors.New("dial " + strconv.Itoa(int(n.Add(1))) + ": connection refused")
	})
	set := retrySet()
	set.Attempts = 4
	tr := mustNew(t, Config{Base: base, Policies: set})
	_, err := get(t, t.Context(), tr, "http://a.test/")
	if err == nil || err.Error() != "resilix: 4 attempts: dial 4: connection refused" {
		t.Fatalf("err = %v, want the fourth attempt's error, saying there were 4", err)
	}
}

func TestNonFailuresAreNotRetried(t *testing.T) {
	for _, code := range []int{200, 404, 501} {
		base := &script{codes: []int{code}}
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.n() != 1 {
			t.Errorf("%d: %d wire calls, want 1", code, base.n())
		}
	}
}

func TestCustomClassify(t *testing.T) {
	base := &script{codes: []int{409, 200}}
	set := retrySet()
	set.Classify = func(resp *http.Response, err error) policy.Outcome {
		if resp != nil && resp.StatusCode == http.StatusConflict {
			return policy.Failure
		}
		return policy.DefaultClassify(resp, err)
	}
	tr := mustNew(t, Config{Base: base, Policies: set})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 200 || base.n() != 2 {
		t.Fatalf("got %v, %v after %d calls", resp, err, base.n())
	}
	resp.Body.Close()
}

func TestPlainPostIsNotRetried(t *testing.T) {
	base := &script{codes: []int{503, 200}}
	var skips []policy.RetrySkip
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
		RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
	}})
	req, _ := http.NewRequest(http.MethodPost, "http://a.test/", strings.NewReader("pay"))
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v", resp, err)
	}
	resp.Body.Close()
	if base.n() != 1 || len(skips) != 1 || skips[0].Reason != policy.SkipNotReplayable {
		t.Fatalf("calls=%d skips=%+v; want one call and a not_replayable skip", base.n(), skips)
	}
}

func TestRepeatablePostIsRetriedWithItsWholeBody(t *testing.T) {
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key", "MarkRepeatable"} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			base := fakeRT(func(r *http.Request) (*http.Response, error) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, string(b))
				n := len(got)
				mu.Unlock()
				if n < 3 {
					return respond(r, 503), nil
				}
				return respond(r, 201), nil
			})
			tr := mustNew(t, Config{Base: base, Policies: retrySet()})
			ctx := t.Context()
			if name == "MarkRepeatable" {
				ctx = MarkRepeatable(ctx)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://a.test/", strings.NewReader("order=42"))
			if name != "MarkRepeatable" {
				req.Header.Set(name, "k1")
			}
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 201 {
				t.Fatalf("got %v, %v", resp, err)
			}
			resp.Body.Close()
			if len(got) != 3 || got[0] != "order=42" || got[1] != "order=42" || got[2] != "order=42" {
				t.Fatalf("bodies received: %q", got)
			}
		})
	}
}

// TestBodyWithoutGetBodyIsNotRetried: with the replay buffer off, a body
// without GetBody cannot be sent again. (With it on, see
// TestBufferedBodyIsReplayed.)
func TestBodyWithoutGetBodyIsNotRetried(t *testing.T) {
	base := &script{codes: []int{503}}
	set := retrySet()
	set.ReplayBuffer = -1
	tr := mustNew(t, Config{Base: base, Policies: set})
	req, _ := http.NewRequest(http.MethodPut, "http://a.test/", io.NopCloser(strings.NewReader("x")))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if base.n() != 1 {
		t.Fatalf("%d wire calls, want 1: the body cannot be replayed", base.n())
	}
}

func TestCallerRequestIsNotModified(t *testing.T) {
	base := &script{codes: []int{503, 503, 200}}
	set := retrySet()
	set.Timeout = &policy.Timeout{PerAttempt: time.Second}
	tr := mustNew(t, Config{Base: base, Policies: set})
	req, _ := http.NewRequest(http.MethodPut, "http://a.test/x", strings.NewReader("payload"))
	req.Header.Set("A", "1")
	before := *req
	beforeHeader := req.Header.Clone()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.Body != before.Body || req.Context() != before.Context() || req.URL != before.URL ||
		len(req.Header) != len(beforeHeader) || req.Header.Get("A") != "1" {
		t.Fatal("the caller's request was modified")
	}
	for i, r := range base.calls {
		if r == req {
			t.Errorf("attempt %d sent the caller's own request although it needed a new context or body", i)
		}
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 200}, hdr: []string{"Retry-After", "3"}}
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		start := time.Now()
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		resp.Body.Close()
		if d := time.Since(start); d != 3*time.Second {
			t.Fatalf("retried after %v, want the 3s Retry-After asked", d)
		}
	})
}

func TestRetryAfterBeyondTheCapIsReturnedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{429, 200}, hdr: []string{"Retry-After", "60"}}
		var skips []policy.RetrySkip
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
			RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
		}})
		start := time.Now()
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 429 || time.Since(start) != 0 {
			t.Fatalf("got %v, %v after %v; want the 429 at once", resp, err, time.Since(start))
		}
		resp.Body.Close()
		if len(skips) != 1 || skips[0].Reason != policy.SkipRetryAfter {
			t.Fatalf("skips %+v", skips)
		}
	})
}

func TestNoSleepOutlivesTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 200}, hdr: []string{"Retry-After", "2"}}
		var skips []policy.RetrySkip
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
			RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
		}})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		resp, err := get(t, ctx, tr, "http://a.test/")
		if err != nil || resp.StatusCode != 503 || time.Since(start) != 0 {
			t.Fatalf("got %v, %v after %v; want the 503 at once", resp, err, time.Since(start))
		}
		resp.Body.Close()
		if base.n() != 1 || len(skips) != 1 || skips[0].Reason != policy.SkipDeadline {
			t.Fatalf("calls %d, skips %+v", base.n(), skips)
		}
	})
}

func TestCancelDuringBackoffReturnsTheCallersError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 200}, hdr: []string{"Retry-After", "5"}}
		var calls []policy.CallInfo
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
			CallDone: func(c policy.CallInfo) { calls = append(calls, c) },
		}})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, cancel)
		_, err := get(t, ctx, tr, "http://a.test/")
		if !errors.Is(err, context.Canceled) || base.n() != 1 {
			t.Fatalf("err = %v after %d calls", err, base.n())
		}
		synctest.Wait()
		if !base.resps[0].Body.(*body).closed.Load() {
			t.Fatal("the superseded response was not closed")
		}
		if len(calls) != 1 || calls[0].Outcome != policy.Canceled {
			t.Fatalf("CallDone %+v, want one canceled call", calls)
		}
	})
}

func TestBudgetRefusalReturnsTheLastResponse(t *testing.T) {
	base := &script{codes: []int{503}}
	set := retrySet()
	set.Budget = policy.Budget{Max: 1, MinPerSecond: -1, Ratio: 0.01}
	var skips []policy.RetrySkip
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
	}})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v", resp, err)
	}
	resp.Body.Close()
	// One token: attempt, retry (token spent), then the budget refuses.
	if base.n() != 2 || len(skips) != 1 || skips[0].Reason != policy.SkipBudget || skips[0].Attempt != 2 {
		t.Fatalf("calls %d, skips %+v", base.n(), skips)
	}
	if m := tr.Measured("a.test"); !m.HasBudget || m.BudgetBalance >= 1 {
		t.Fatalf("Measured %+v", m)
	}
}

func TestBudgetsArePerKey(t *testing.T) {
	base := &script{codes: []int{503}}
	set := retrySet()
	set.Budget = policy.Budget{Max: 1, MinPerSecond: -1, Ratio: 0.01}
	tr := mustNew(t, Config{Base: base, Policies: set})
	for _, host := range []string{"a.test", "a.test", "b.test"} {
		resp, err := get(t, t.Context(), tr, "http://"+host+"/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// a: 2 calls then 1 (budget spent); b: 2 calls with its own token.
	if base.n() != 5 {
		t.Fatalf("%d wire calls, want 5", base.n())
	}
}

func TestPerAttemptTimeoutIsToldApartFromTheCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := fakeRT(func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		tr := mustNew(t, Config{Base: hang, Policies: policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}})

		start := time.Now()
		_, err := get(t, t.Context(), tr, "http://a.test/")
		if !errors.Is(err, policy.ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want an attempt timeout", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("timed out after %v, want 1s", d)
		}
		var te interface{ Timeout() bool }
		if !errors.As(err, &te) || !te.Timeout() {
			t.Fatal("an attempt timeout should be a net.Error with Timeout() true")
		}

		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err = get(t, ctx, tr, "http://a.test/")
		if errors.Is(err, policy.ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the caller's own deadline", err)
		}
	})
}

func TestTimedOutAttemptsAreRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return respond(r, 200), nil
		})
		set := retrySet()
		set.Timeout = &policy.Timeout{PerAttempt: time.Second}
		tr := mustNew(t, Config{Base: base, Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 200 || n.Load() != 2 {
			t.Fatalf("got %v, %v after %d calls", resp, err, n.Load())
		}
		resp.Body.Close()
	})
}

// slowBody yields one byte a second, until its context ends.
type slowBody struct {
	ctx    context.Context
	left   int
	closed atomic.Bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	select {
	case <-time.After(time.Second):
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	b.left--
	p[0] = 'x'
	return 1, nil
}

func (b *slowBody) Close() error { b.closed.Store(true); return nil }

func TestSlowBodyIsNotCutByPerAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var attemptCtx context.Context
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			attemptCtx = r.Context()
			resp := respond(r, 200)
			resp.Body = &slowBody{ctx: r.Context(), left: 5}
			return resp, nil
		})
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "xxxxx" {
			t.Fatalf("read %q, %v: the body must stream past PerAttempt", b, err)
		}
		if attemptCtx.Err() == nil {
			t.Fatal("the attempt's context must be released at EOF")
		}
		resp.Body.Close()
	})
}

// TestUpstreamSlowBodyIsNotCutByPerAttempt is the same against the
// in-memory upstream, whose body reads fail once the request's context
// ends, as net/http's do: the headers come at once, then four chunks 60ms
// apart, the last 130ms past a 50ms PerAttempt.
func TestUpstreamSlowBodyIsNotCutByPerAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			BodySize: 400,
			Chunks:   4,
			Faults:   []httptestutil.Fault{{Probability: 1, Status: 200, SlowBody: 60 * time.Millisecond}},
		})
		tracker := httptestutil.Track(up.RoundTripper())
		set := policy.Set{Timeout: &policy.Timeout{PerAttempt: 50 * time.Millisecond}}
		tr := mustNew(t, Config{Base: tracker, Policies: set})
		start := time.Now()
		resp, err := (&http.Client{Transport: tr}).Get("http://up.test/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(b) != 400 {
			t.Fatalf("read %d bytes, %v; the body streams under the caller's context, not PerAttempt", len(b), err)
		}
		if d := time.Since(start); d != 180*time.Millisecond {
			t.Fatalf("the body ended after %v, want 180ms", d)
		}
		if tracker.Open() != 0 {
			t.Fatal("body left open")
		}
	})
}

func TestAttemptContextLivesUntilTheBodyIsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var attemptCtx context.Context
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			attemptCtx = r.Context()
			return respond(r, 200), nil
		})
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		if attemptCtx.Err() != nil {
			t.Fatal("the attempt's context ended before the body was closed")
		}
		resp.Body.Close()
		if attemptCtx.Err() == nil {
			t.Fatal("the attempt's context outlived the body")
		}
		resp.Body.Close() // twice is harmless
	})
}

func TestBaseContractViolationsAreContained(t *testing.T) {
	b := &body{Reader: strings.NewReader("")}
	both := fakeRT(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: b}, errors.New("boom")
	})
	tr := mustNew(t, Config{Base: both})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if resp != nil || err == nil || !b.closed.Load() {
		t.Fatalf("got %v, %v; closed=%v", resp, err, b.closed.Load())
	}
	neither := fakeRT(func(r *http.Request) (*http.Response, error) { return nil, nil })
	tr = mustNew(t, Config{Base: neither})
	if resp, err := get(t, t.Context(), tr, "http://a.test/"); resp != nil || err == nil {
		t.Fatalf("got %v, %v; want an error for (nil, nil)", resp, err)
	}
}

func TestMaxKeysBoundsTheRegistry(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, Config{Base: base, MaxKeys: 64, Policies: retrySet()})
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	for i := range 100_000 {
		req.URL.Host = "h" + strconv.Itoa(i)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := tr.scopes.len(); n > 64 {
		t.Fatalf("%d scopes held, want at most 64", n)
	}
	if !tr.Measured("h99999").Known {
		t.Fatal("the most recent key should still be known")
	}
}

func TestEvictionPrefersIdleKeys(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, Config{Base: base, MaxKeys: 16})
	req, _ := http.NewRequest(http.MethodGet, "http://hot/", nil)
	for i := range 10_000 {
		if i%2 == 0 {
			req.URL.Host = "hot"
		} else {
			req.URL.Host = "cold" + strconv.Itoa(i)
		}
		resp, _ := tr.RoundTrip(req)
		resp.Body.Close()
	}
	if !tr.Measured("hot").Known {
		t.Fatal("a key used every other call was evicted")
	}
}

func TestPerKeyReplacesPolicies(t *testing.T) {
	base := &script{codes: []int{503}}
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), PerKey: map[string]policy.Set{"fragile.test": {}}})
	for _, host := range []string{"fragile.test", "sturdy.test"} {
		resp, err := get(t, t.Context(), tr, "http://"+host+"/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if base.n() != 4 { // 1 for fragile (no retry), 3 for sturdy
		t.Fatalf("%d wire calls, want 4", base.n())
	}
}

func TestPriorityFromContextThenHeader(t *testing.T) {
	var got []shedding.Priority
	var bad []policy.MalformedHeader
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, Config{Base: base, PriorityHeader: "x-prio", Observer: &policy.Observer{
		CallDone:        func(c policy.CallInfo) { got = append(got, c.Priority) },
		MalformedHeader: func(m policy.MalformedHeader) { bad = append(bad, m) },
	}})
	for _, tc := range []struct {
		ctx    context.Context
		header string
	}{
		{t.Context(), ""},
		{t.Context(), "bulk"},
		{t.Context(), "Best-Effort"},
		{shedding.WithPriority(t.Context(), shedding.Degraded), "bulk"},
		{t.Context(), "urgent!!"},
	} {
		req, _ := http.NewRequestWithContext(tc.ctx, http.MethodGet, "http://a.test/", nil)
		if tc.header != "" {
			req.Header.Set("X-Prio", tc.header)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	want := []shedding.Priority{shedding.Critical, shedding.Bulk, shedding.BestEffort, shedding.Degraded, shedding.Critical}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("priorities %v, want %v", got, want)
		}
	}
	if len(bad) != 1 || bad[0].Value != "urgent!!" || tr.Measured("a.test").MalformedHeaders != 1 {
		t.Fatalf("malformed headers reported %+v", bad)
	}
}

func TestObserverSeesEveryAttempt(t *testing.T) {
	base := &script{codes: []int{503, 200}}
	var attempts []policy.AttemptInfo
	var calls []policy.CallInfo
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
		AttemptDone: func(a policy.AttemptInfo) { attempts = append(attempts, a) },
		CallDone:    func(c policy.CallInfo) { calls = append(calls, c) },
	}})
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(attempts) != 2 || attempts[0].Kind != policy.AttemptFirst || attempts[0].Outcome != policy.Failure ||
		attempts[1].Kind != policy.AttemptRetry || attempts[1].Outcome != policy.Success || attempts[1].Attempt != 2 {
		t.Fatalf("attempts %+v", attempts)
	}
	if len(calls) != 1 || calls[0].WireAttempts != 2 || calls[0].Outcome != policy.Success || calls[0].StatusCode != 200 {
		t.Fatalf("calls %+v", calls)
	}
}

func TestUnhedgedPathAllocatesNothingOfItsOwn(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return resp, nil })
	for name, set := range map[string]policy.Set{"bare": {}, "retry": retrySet()} {
		tr := mustNew(t, Config{Base: base, Policies: set})
		req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
		if n := testing.AllocsPerRun(1000, func() { _, _ = tr.RoundTrip(req) }); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
}

// TestMalformedValuesAreReportedCut: the Observer is given at most the
// first 64 bytes of a malformed value, cut at a rune's start, as
// admission gives them: a priority header, a 503's Retry-After and a
// tenant id Propagate cannot write, however long each is.
func TestMalformedValuesAreReportedCut(t *testing.T) {
	long := strings.Repeat("é", 1<<19) // 1 MiB
	want := strings.Repeat("é", 32)
	var bad []policy.MalformedHeader
	base := &script{codes: []int{503, 200}, hdr: []string{"Retry-After", "x" + long}}
	set := policy.Set{Propagate: true, Retry: &policy.Retry{Delay: func(int) time.Duration { return 0 }}}
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
		MalformedHeader: func(m policy.MalformedHeader) { bad = append(bad, m) },
	}})
	ctx := tenant.With(t.Context(), "\x00"+long)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
	req.Header.Set("Resilix-Priority", long)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	wants := map[string]string{
		"Resilix-Priority": want,
		"Resilix-Tenant":   "\x00" + strings.Repeat("é", 31),
		"Retry-After":      "x" + strings.Repeat("é", 31),
	}
	if len(bad) != len(wants) {
		t.Errorf("%d malformed values reported, want %d", len(bad), len(wants))
	}
	for _, m := range bad {
		if m.Value != wants[m.Header] {
			t.Errorf("%s: reported %d bytes, %.70q...; want %q", m.Header, len(m.Value), m.Value, wants[m.Header])
		}
	}
}
