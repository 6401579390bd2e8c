package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// refused is a base whose every call fails as a refused dial does.
func refused() (http.RoundTripper, *atomic.Int32) {
	var n atomic.Int32
	return fakeRT(func(r *http.Request) (*http.Response, error) {
		n.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}), &n
}

// TestErrorSaysHowManyAttempts: when the last of several attempts failed
// with an error, the caller's error says how many wire attempts were made,
// and still reaches every error it wraps, through http.Client too.
func TestErrorSaysHowManyAttempts(t *testing.T) {
	base, sent := refused()
	var calls []policy.CallInfo
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
		CallDone: func(c policy.CallInfo) { calls = append(calls, c) },
	}})
	_, err := get(t, t.Context(), tr, "http://a.test/")
	if want := "resilix: 3 attempts: dial tcp: connect: connection refused"; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	var op *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("err = %v does not reach the wrapped *net.OpError", err)
	}
	if sent.Load() != 3 || len(calls) != 1 || calls[0].Err != err || calls[0].WireAttempts != 3 {
		t.Fatalf("%d wire calls, CallDone %+v; want 3, and the error the caller got", sent.Load(), calls)
	}

	_, err = (&http.Client{Transport: tr}).Get("http://a.test/")
	var ue *url.Error
	if !errors.As(err, &ue) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &op) {
		t.Fatalf("through http.Client: err = %v", err)
	}
}

// TestTimedOutAttemptsSayHowManyThereWere: the issue's own example, with
// errors.Is and a *url.Error's Timeout still working through the wrapper.
func TestTimedOutAttemptsSayHowManyThereWere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := retrySet()
		set.Timeout = &policy.Timeout{PerAttempt: time.Second}
		tr := mustNew(t, Config{Base: hang, Policies: set})
		_, err := (&http.Client{Transport: tr}).Get("http://a.test/")
		want := `Get "http://a.test/": resilix: 3 attempts: attempt timed out: no response headers after 1s`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
		var ue *url.Error
		if !errors.As(err, &ue) || !ue.Timeout() {
			t.Fatalf("err = %v: want a *url.Error whose Timeout is true", err)
		}
		if !errors.Is(err, policy.ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v: want it to match ErrAttemptTimeout and DeadlineExceeded", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("err = %v: want a net.Error whose Timeout is true", err)
		}
	})
}

// TestRejectionFromAnInnerTransportIsReached: a base that is itself a
// resilix transport refuses with a *policy.RejectedError; after several
// attempts it is still reached, and its message is not prefixed twice.
func TestRejectionFromAnInnerTransportIsReached(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		return nil, &policy.RejectedError{Gate: policy.GateBreaker, Err: policy.ErrCircuitOpen, Key: "inner", Priority: shedding.Critical}
	})
	tr := mustNew(t, Config{Base: base, Policies: retrySet()})
	_, err := get(t, t.Context(), tr, "http://a.test/")
	if want := `resilix: 3 attempts: circuit open (key "inner", priority critical)`; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	var rej *policy.RejectedError
	if !errors.As(err, &rej) || rej.Key != "inner" || !errors.Is(err, policy.ErrRejected) || !errors.Is(err, policy.ErrCircuitOpen) {
		t.Fatalf("err = %v does not reach the *policy.RejectedError", err)
	}
	if ne := net.Error(nil); errors.As(err, &ne) {
		t.Fatalf("err = %v is a net.Error (%T); the wrapper must not make one of a refusal", err, ne)
	}
}

// TestOneAttemptsErrorIsUnwrapped: a call that made a single wire attempt
// returns that attempt's error as it is, so err == sentinel comparisons
// keep working for callers that never retry.
func TestOneAttemptsErrorIsUnwrapped(t *testing.T) {
	sentinel := errors.New("boom")
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return nil, sentinel })
	for name, tc := range map[string]struct {
		set policy.Set
		ctx context.Context
	}{
		"no retry in the set": {policy.Set{}, t.Context()},
		"Attempts 1":          {retrySet(), WithOverride(t.Context(), Override{Attempts: 1})},
		"NoRetry":             {retrySet(), WithOverride(t.Context(), Override{NoRetry: true})},
	} {
		tr := mustNew(t, Config{Base: base, Policies: tc.set})
		if _, err := get(t, tc.ctx, tr, "http://a.test/"); err != sentinel {
			t.Errorf("%s: err = %v, want the base's own error", name, err)
		}
	}
}

// TestCallersCancellationIsUnwrapped: the caller's own cancellation or
// deadline comes back as the context's error itself, however many
// attempts were made before it.
func TestCallersCancellationIsUnwrapped(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(context.Context) (context.Context, context.CancelFunc)
		want error
	}{
		{"cancel", func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(time.Second, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"deadline", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Second)
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var n atomic.Int32
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					if n.Add(1) < 3 {
						return nil, fmt.Errorf("dial %d: connection refused", n.Load())
					}
					<-r.Context().Done()
					return nil, r.Context().Err()
				})
				tr := mustNew(t, Config{Base: base, Policies: retrySet()})
				ctx, cancel := tc.end(t.Context())
				defer cancel()
				_, err := get(t, ctx, tr, "http://a.test/")
				if err != tc.want || n.Load() != 3 {
					t.Fatalf("err = %v after %d attempts, want %v itself", err, n.Load(), tc.want)
				}
			})
		})
	}
}
