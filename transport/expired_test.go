package transport

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestAnAttemptItsCallersDeadlineEndedIsNoAccept: a dependency that
// answers nothing within its callers' 100ms deadlines is refusing their
// work as surely as one that answers 503: the throttler counts each such
// attempt as a request it did not accept, and starts refusing. An attempt
// the caller cancelled itself (context.Canceled) says nothing of the
// dependency and stays withdrawn.
func TestAnAttemptItsCallersDeadlineEndedIsNoAccept(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(parent context.Context) (context.Context, context.CancelFunc)
		want bool // pressure
	}{
		{"deadline", func(p context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(p, 100*time.Millisecond)
		}, true},
		{"cancelled", func(p context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(p)
			stop := time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := fakeRT(func(r *http.Request) (*http.Response, error) { return respondAfter(r, time.Hour) })
				set := policy.Set{Throttler: &policy.Throttler{}}
				tr := mustNew(t, Config{Base: base, Policies: set})
				for range 25 { // MinRequests is 20
					ctx, cancel := tc.end(t.Context())
					if _, err := do(t, ctx, tr); err == nil {
						t.Error("a call answered, want its context's error")
					}
					cancel()
				}
				p := tr.Measured("up.test").Pressure
				if got := p > 0; got != tc.want {
					t.Errorf("pressure %v after 25 attempts ended by the caller's %s, want pressure %v", p, tc.name, tc.want)
				}
			})
		})
	}
}
