package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
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

// TestRoundTimerKeepsHedgesAndTheInlineTimeout: a hedged round's one
// timer sends the hedges at their times and ends the inline leg at its
// per-attempt timeout, in whichever order they come; each hedge leg keeps
// its own timeout.
func TestRoundTimerKeepsHedgesAndTheInlineTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout float64 // × the threshold
		starts  []float64
		ends    []float64 // of each leg, by its timeout
	}{
		{"timeout after two hedges", 2.5, []float64{0, 1, 2}, []float64{2.5, 3.5, 4.5}},
		{"timeout before the first hedge", 0.5, []float64{0}, []float64{0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				type legSeen struct {
					start, end time.Time
					cause      error
				}
				var (
					mu   sync.Mutex
					legs []*legSeen
					hang atomic.Bool
				)
				base := fakeRT(func(r *http.Request) (*http.Response, error) {
					if !hang.Load() {
						time.Sleep(10 * time.Millisecond)
						return respond(r, 200), nil
					}
					l := &legSeen{start: time.Now()}
					mu.Lock()
					legs = append(legs, l)
					mu.Unlock()
					<-r.Context().Done()
					mu.Lock()
					l.end, l.cause = time.Now(), context.Cause(r.Context())
					mu.Unlock()
					return nil, l.cause
				})
				set := policy.Set{
					Attempts: 3,
					Hedge:    &policy.Hedge{MaxConcurrent: 3, MinSamples: 5},
					Budget:   policy.Budget{Ratio: -1},
					Timeout:  &policy.Timeout{PerAttempt: time.Hour},
				}
				tr := mustNew(t, Config{Base: base, Policies: set})
				warm(t, tr, 5)
				th := tr.Measured("up.test").HedgeThreshold
				at := func(x float64) time.Duration { return time.Duration(x * float64(th)) }
				hang.Store(true)
				t0 := time.Now()
				ctx := WithOverride(t.Context(), Override{PerAttempt: at(tc.timeout)})
				_, err := get(t, ctx, tr, "http://up.test/")
				if !errors.Is(err, policy.ErrAttemptTimeout) {
					t.Fatalf("err = %v, want the last leg's timeout", err)
				}
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if len(legs) != len(tc.starts) {
					t.Fatalf("%d legs, want %d", len(legs), len(tc.starts))
				}
				for i, l := range legs {
					if got, want := l.start.Sub(t0), at(tc.starts[i]); got != want {
						t.Errorf("leg %d started at %v, want %v", i, got, want)
					}
					if got, want := l.end.Sub(t0), at(tc.ends[i]); got != want {
						t.Errorf("leg %d ended at %v, want %v", i, got, want)
					}
					if !errors.Is(l.cause, policy.ErrAttemptTimeout) {
						t.Errorf("leg %d ended by %v, want its timeout", i, l.cause)
					}
				}
			})
		})
	}
}
