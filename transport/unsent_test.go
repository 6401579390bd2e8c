package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/policy"
)

// The errors of attempts that never reached the server, and of some that
// may have, as net/http returns them.
var (
	errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	errReset   = &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
)

// attemptLog records what an observer saw of attempts and skipped retries.
type attemptLog struct {
	mu       sync.Mutex
	attempts []policy.AttemptInfo
	skips    []policy.RetrySkip
}

func (a *attemptLog) observer() *policy.Observer {
	return &policy.Observer{
		AttemptDone:  func(i policy.AttemptInfo) { a.mu.Lock(); a.attempts = append(a.attempts, i); a.mu.Unlock() },
		RetrySkipped: func(s policy.RetrySkip) { a.mu.Lock(); a.skips = append(a.skips, s); a.mu.Unlock() },
	}
}

// reasons returns the kind and retry reason of each attempt, as "first",
// "retry/unsent", ...
func (a *attemptLog) reasons() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, i := range a.attempts {
		s := i.Kind.String()
		if i.Kind == policy.AttemptRetry {
			s += "/" + i.Reason.String()
		}
		out = append(out, s)
	}
	return out
}

// sink is a base whose first answers are the errors it is given, before it
// reads the request's body, and then 200s; it keeps every body it read.
type sink struct {
	mu     sync.Mutex
	errs   []error
	calls  int
	bodies []string
}

func (s *sink) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	i := s.calls
	s.calls++
	s.mu.Unlock()
	if i < len(s.errs) {
		closeBody(r.Body) // as net/http does when it cannot connect
		return nil, s.errs[i]
	}
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	s.bodies = append(s.bodies, string(b))
	s.mu.Unlock()
	return respond(r, 200), nil
}

func (s *sink) n() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

func post(t *testing.T, ctx context.Context, rt http.RoundTripper, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

// TestUnsentPostIsRetried: a POST whose connection was refused never
// reached the server, so it is retried like any failure, and the retry
// carries its body, byte for byte. The observer hears a retry whose
// reason is that the attempt before it was unsent.
func TestUnsentPostIsRetried(t *testing.T) {
	const payload = `{"charge":1}`
	base := &sink{errs: []error{errRefused, fmt.Errorf("my dialer: %w", errRefused)}}
	var log attemptLog
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
	resp, err := post(t, t.Context(), tr, "http://a.test/", payload)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v, %v; want the third attempt's 200", resp, err)
	}
	resp.Body.Close()
	if base.n() != 3 || len(base.bodies) != 1 || base.bodies[0] != payload {
		t.Fatalf("%d wire calls, bodies %q; want 3 calls and the payload once", base.n(), base.bodies)
	}
	want := []string{"first", "retry/unsent", "retry/unsent"}
	if got := log.reasons(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempts %v, want %v", got, want)
	}
}

// TestAmbiguousPostIsNotRetried: an error that does not prove the request
// unsent (a reset, a timeout, an EOF after writing) leaves a POST at one
// wire call, skipped as not replayable, while a GET with the same error is
// retried, for the reason that its answer asked for it.
func TestAmbiguousPostIsNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"reset after writing", errReset},
		{"timeout awaiting headers", errors.New("net/http: timeout awaiting response headers")},
		{"EOF on a reused connection", io.EOF},
		{"GOAWAY that may cover the stream", errors.New(`http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, debug=""`)},
		{"stream reset after writing", errors.New("stream error: stream ID 1; INTERNAL_ERROR; received from peer")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &sink{errs: []error{tc.err, tc.err, tc.err}}
			var log attemptLog
			tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
			_, err := post(t, t.Context(), tr, "http://a.test/", "charge=1")
			if !errors.Is(err, tc.err) && err.Error() != tc.err.Error() {
				t.Fatalf("err %v, want the attempt's own", err)
			}
			if base.n() != 1 || len(log.skips) != 1 || log.skips[0].Reason != policy.SkipNotReplayable {
				t.Fatalf("%d wire calls, skips %+v; want one call, not replayable", base.n(), log.skips)
			}

			base = &sink{errs: []error{tc.err}}
			log = attemptLog{}
			tr = mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
			resp, err := get(t, t.Context(), tr, "http://a.test/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := "[first retry/asked]"; fmt.Sprint(log.reasons()) != want {
				t.Fatalf("a GET's attempts %v, want %s", log.reasons(), want)
			}
		})
	}
}

// TestUnsentRetryIsAnyRetry: an unsent retry waits the backoff, counts
// against Attempts, draws from the budget, and is subject to Retry.If;
// without Retry (a hedging set) a POST is never re-sent.
func TestUnsentRetryIsAnyRetry(t *testing.T) {
	t.Run("backoff and attempts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var sent []time.Duration
			start := time.Now()
			base := &sink{errs: []error{errRefused, errRefused, errRefused}}
			probe := fakeRT(func(r *http.Request) (*http.Response, error) {
				sent = append(sent, time.Since(start))
				return base.RoundTrip(r)
			})
			set := policy.Set{Attempts: 2, Retry: &policy.Retry{Delay: func(int) time.Duration { return 7 * time.Second }}}
			tr := mustNew(t, Config{Base: probe, Policies: set})
			_, err := post(t, t.Context(), tr, "http://a.test/", "x")
			if !errors.Is(err, syscall.ECONNREFUSED) || !strings.HasPrefix(err.Error(), "resilix: 2 attempts: ") {
				t.Fatalf("err %v; want the refusal after 2 attempts", err)
			}
			if want := []time.Duration{0, 7 * time.Second}; fmt.Sprint(sent) != fmt.Sprint(want) {
				t.Fatalf("attempts sent at %v, want %v", sent, want)
			}
		})
	})
	t.Run("budget", func(t *testing.T) {
		base := &sink{errs: []error{errRefused, errRefused}}
		set := retrySet()
		set.Budget = policy.Budget{Max: 1, Ratio: 0.001, MinPerSecond: -1}
		var log attemptLog
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: log.observer()})
		if _, err := post(t, t.Context(), tr, "http://a.test/", "x"); err == nil {
			t.Fatal("want the second refusal")
		}
		if base.n() != 2 || len(log.skips) != 1 || log.skips[0].Reason != policy.SkipBudget {
			t.Fatalf("%d wire calls, skips %+v; want 2 and a budget skip", base.n(), log.skips)
		}
	})
	t.Run("Retry.If says no", func(t *testing.T) {
		base := &sink{errs: []error{errRefused}}
		set := retrySet()
		set.Retry.If = func(*http.Response, error) bool { return false }
		tr := mustNew(t, Config{Base: base, Policies: set})
		if _, err := post(t, t.Context(), tr, "http://a.test/", "x"); err == nil || base.n() != 1 {
			t.Fatalf("%d wire calls, err %v; want one", base.n(), err)
		}
	})
	t.Run("hedging only", func(t *testing.T) {
		base := &sink{errs: []error{errRefused}}
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet()})
		if _, err := post(t, t.Context(), tr, "http://a.test/", "x"); err == nil || base.n() != 1 {
			t.Fatalf("%d wire calls, err %v; want one", base.n(), err)
		}
	})
}

// TestLoopbackUnsent: over real sockets and net/http's transport, a POST
// to a closed port is retried up to Attempts, each retry reported unsent;
// a POST refused by a TLS handshake is retried too; a POST to a server
// whose certificate is not trusted is not, the error being permanent.
func TestLoopbackUnsent(t *testing.T) {
	quiet := log.New(io.Discard, "", 0)
	t.Run("closed port", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + l.Addr().String() + "/"
		l.Close()
		var log attemptLog
		base := cleanhttp.DefaultPooledTransport()
		defer base.CloseIdleConnections()
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
		_, err = (&http.Client{Transport: tr}).Post(url, "text/plain", strings.NewReader("charge=1"))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("err %v, want connection refused", err)
		}
		if want := "[first retry/unsent retry/unsent]"; fmt.Sprint(log.reasons()) != want {
			t.Fatalf("attempts %v, want %s", log.reasons(), want)
		}
	})
	t.Run("TLS version refused", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
		srv.Config.ErrorLog = quiet
		srv.StartTLS()
		defer srv.Close()
		base := srv.Client().Transport.(*http.Transport).Clone()
		base.TLSClientConfig.MaxVersion = tls.VersionTLS12
		defer base.CloseIdleConnections()
		var log attemptLog
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
		if _, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x")); err == nil {
			t.Fatal("the handshake succeeded")
		}
		if want := "[first retry/unsent retry/unsent]"; fmt.Sprint(log.reasons()) != want {
			t.Fatalf("attempts %v, want %s", log.reasons(), want)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.Config.ErrorLog = quiet
		srv.StartTLS()
		defer srv.Close()
		base := cleanhttp.DefaultPooledTransport()
		defer base.CloseIdleConnections()
		var log attemptLog
		tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
		if _, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x")); err == nil {
			t.Fatal("an untrusted certificate was accepted")
		}
		if len(log.attempts) != 1 || len(log.skips) != 1 || log.skips[0].Reason != policy.SkipPermanent {
			t.Fatalf("attempts %v, skips %+v; want one attempt, skipped as permanent", log.reasons(), log.skips)
		}
	})
}
