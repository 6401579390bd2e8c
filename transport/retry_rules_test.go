package transport

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestDelayReplacesTheBackoff: with Retry.Delay set, the waits between
// attempts are exactly what it returns, asked with the retry's number
// from 1, and no jitter is drawn.
func TestDelayReplacesTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &script{codes: []int{503, 503, 503, 200}}
		var mu sync.Mutex
		var asked []int
		var sent []time.Duration
		start := time.Now()
		probe := fakeRT(func(r *http.Request) (*http.Response, error) {
			sent = append(sent, time.Since(start))
			return base.RoundTrip(r)
		})
		set := policy.Set{Attempts: 4, Retry: &policy.Retry{Delay: func(retry int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, retry)
			return time.Duration(retry) * 7 * time.Second
		}}}
		tr := mustNew(t, Config{Base: probe, Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		resp.Body.Close()
		if want := []int{1, 2, 3}; !slices.Equal(asked, want) {
			t.Errorf("Delay asked for retries %v, want %v", asked, want)
		}
		want := []time.Duration{0, 7 * time.Second, 21 * time.Second, 42 * time.Second}
		if !slices.Equal(sent, want) {
			t.Errorf("attempts sent at %v, want %v", sent, want)
		}
	})
}

// TestDelayIsBoundedByRetryAfterAndTheDeadline: Retry-After, MaxRetryAfter
// and the deadline apply on top of Delay as they do on top of the backoff.
func TestDelayIsBoundedByRetryAfterAndTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		delay      time.Duration
		retryAfter string
		deadline   time.Duration // 0: none
		wait       time.Duration // before the retry; -1: no retry
		skip       policy.SkipReason
	}{
		{"Retry-After longer", time.Second, "3", 0, 3 * time.Second, 0},
		{"Delay longer", 5 * time.Second, "3", 0, 5 * time.Second, 0},
		{"Retry-After beyond MaxRetryAfter", time.Second, "60", 0, -1, policy.SkipRetryAfter},
		{"Delay past the deadline", 10 * time.Second, "", 5 * time.Second, -1, policy.SkipDeadline},
		{"negative Delay", -time.Second, "", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var hdr []string
				if tc.retryAfter != "" {
					hdr = []string{"Retry-After", tc.retryAfter}
				}
				base := &script{codes: []int{503, 200}, hdr: hdr}
				var skips []policy.RetrySkip
				set := policy.Set{Retry: &policy.Retry{Delay: func(int) time.Duration { return tc.delay }}}
				tr := mustNew(t, Config{Base: base, Policies: set, Observer: &policy.Observer{
					RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
				}})
				ctx := t.Context()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				start := time.Now()
				resp, err := get(t, ctx, tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				took := time.Since(start)
				if tc.wait < 0 {
					if base.n() != 1 || took != 0 || len(skips) != 1 || skips[0].Reason != tc.skip {
						t.Fatalf("%d calls after %v, skips %+v; want one call, at once, skipped for %v", base.n(), took, skips, tc.skip)
					}
					return
				}
				if base.n() != 2 || took != tc.wait || resp.StatusCode != 200 {
					t.Fatalf("%d calls, %d after %v; want the retry after %v", base.n(), resp.StatusCode, took, tc.wait)
				}
			})
		})
	}
}
