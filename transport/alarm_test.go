package transport

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestInBubble holds inBubble, which decides whether a call may take a
// pooled timer, to the Go release in use: a time read inside a synctest
// bubble has no monotonic reading, one read outside has.
func TestInBubble(t *testing.T) {
	if inBubble(time.Now()) {
		t.Fatal("outside a bubble: inBubble(time.Now()) is true")
	}
	synctest.Test(t, func(t *testing.T) {
		if !inBubble(time.Now()) {
			t.Fatal("inside a bubble: inBubble(time.Now()) is false; a pooled timer could cross bubbles")
		}
	})
}

// TestPooledTimeoutsFireForTheirOwnCall runs, outside any bubble, calls
// with a per-attempt timeout from several goroutines, half of them to a
// base that answers at once (their timers stop in time and are reused)
// and half to one that waits for its context. A reused timer must fire
// for the call that armed it last, after that call's full PerAttempt, and
// never for a call that has its headers: every slow call times out, none
// before PerAttempt, and every fast call's context is live until its body
// is closed.
func TestPooledTimeoutsFireForTheirOwnCall(t *testing.T) {
	const perAttempt = 20 * time.Millisecond
	tr := mustNew(t, Config{
		Base: fakeRT(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("Slow") != "" {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return respond(r, 200), nil
		}),
		Policies: policy.Set{Timeout: &policy.Timeout{PerAttempt: perAttempt}},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
				slow := (g+i)%4 == 0
				if slow {
					req.Header.Set("Slow", "1")
				}
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				took := time.Since(start)
				switch {
				case slow && !errors.Is(err, policy.ErrAttemptTimeout):
					t.Errorf("a slow call: %v, want ErrAttemptTimeout", err)
				case slow && took < perAttempt:
					t.Errorf("a slow call timed out after %v, before its PerAttempt (%v)", took, perAttempt)
				case slow:
				case err != nil:
					t.Errorf("a fast call: %v", err)
				default:
					time.Sleep(perAttempt / 10) // a stale timer would fire here
					if err := resp.Request.Context().Err(); err != nil {
						t.Errorf("a fast call's context ended before its body was closed: %v", err)
					}
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
}
