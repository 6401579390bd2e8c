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

	"github.com/resilix/resilix/policy"
)

// ctxBody is a response body that fails, as net/http's do, once the
// context of the request it answers has ended.
type ctxBody struct {
	ctx context.Context
	r   io.Reader
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.r.Read(p)
}

func (b *ctxBody) Close() error { return nil }

// TestHeadersAtTheTimeoutAreOneOrTheOther: the headers come back at the
// instant the per-attempt timer fires. The call returns either the attempt
// timeout or a response whose body reads to its end, never a response
// whose attempt the timer has already cancelled; whether a round hedges or
// not.
func TestHeadersAtTheTimeoutAreOneOrTheOther(t *testing.T) {
	const d = 50 * time.Millisecond
	for _, tc := range []struct {
		name string
		set  policy.Set
	}{
		{"single leg", policy.Set{Timeout: &policy.Timeout{PerAttempt: d}}},
		// The window learns 1ms, so the hedge is due at 1ms, and the
		// hedge leg hangs until it is cancelled: the inline leg's answer
		// is the one that races its timer.
		{"hedged round", policy.Set{Timeout: &policy.Timeout{PerAttempt: d}, Hedge: &policy.Hedge{MinSamples: 5},
			Budget: policy.Budget{Ratio: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32 // of the call under way: its inline leg is the first
				var warmed atomic.Bool
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					wait := d
					switch {
					case !warmed.Load():
						wait = time.Millisecond
					case calls.Add(1) > 1: // a hedge leg: it hangs
						<-r.Context().Done()
						return nil, context.Cause(r.Context())
					}
					time.Sleep(wait)
					resp := respond(r, 200)
					resp.Body = &ctxBody{ctx: r.Context(), r: strings.NewReader("whole")}
					return resp, nil
				})
				tr := mustNew(t, Config{Base: base, Policies: tc.set})
				for range 5 {
					if _, err := do(t, t.Context(), tr); err != nil {
						t.Fatal(err)
					}
				}
				warmed.Store(true)
				var timedOut, whole int
				for range 50 {
					calls.Store(0)
					resp, err := get(t, t.Context(), tr, "http://up.test/")
					if err != nil {
						if !errors.Is(err, policy.ErrAttemptTimeout) {
							t.Fatalf("err = %v, want an attempt timeout", err)
						}
						timedOut++
						continue
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || string(b) != "whole" {
						t.Fatalf("read %q, %v: a response was returned whose attempt had timed out", b, err)
					}
					whole++
				}
				t.Logf("%d timed out, %d whole", timedOut, whole)
				synctest.Wait()
			})
		})
	}
}
