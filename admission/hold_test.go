package admission

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestRefusalSaysHowLongItMeans: beside Retry-After's whole seconds, a
// refusal says its estimate of the wait in milliseconds, once the limiter
// has learned a baseline to estimate it from.
func TestRefusalSaysHowLongItMeans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		service := time.Duration(0)
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if service > 0 {
				time.Sleep(service)
				return
			}
			b.ServeHTTP(w, r)
		})
		h := mustHandler(t, next, Config{Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1}})
		refuse := func(wantSecs, wantMs string) {
			t.Helper()
			_, first := inBackground(h, newRequest(context.Background()))
			_, second := inBackground(h, newRequest(context.Background())) // queued
			w := serve(h, newRequest(context.Background()))
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != wantSecs || w.Header().Get("Resilix-Retry-After-Ms") != wantMs {
				t.Errorf("answer %d, Retry-After %q, Resilix-Retry-After-Ms %q; want 503, %q, %q",
					w.Code, w.Header().Get("Retry-After"), w.Header().Get("Resilix-Retry-After-Ms"), wantSecs, wantMs)
			}
			close(b.release)
			<-first
			<-second
			b.release = make(chan struct{})
		}
		refuse("1", "") // no baseline yet: nothing to say in milliseconds

		// 20 requests at 30ms each teach the baseline: the refused request
		// would be second in line, one slot freeing every 30ms.
		service = 30 * time.Millisecond
		for range 20 {
			serve(h, newRequest(context.Background()))
		}
		service = 0
		refuse("1", "60")
	})
}
