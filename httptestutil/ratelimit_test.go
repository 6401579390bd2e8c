package httptestutil_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// get makes one GET through rt and returns the status, the Retry-After
// header and how long the call took; the body is read and closed.
func get(t *testing.T, rt http.RoundTripper) (int, string, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := rt.RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	return resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(start)
}

// TestRateLimitAdmitsItsRate: in virtual time, one request a millisecond
// for two seconds against 100/s with a burst of 5: the burst, then exactly
// the rate, passes; the rest is refused with 429 and Retry-After: 1, after
// Delay, without reaching the upstream.
func TestRateLimitAdmitsItsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{})
		rl := httptestutil.NewRateLimit(up, httptestutil.RateLimitOptions{PerSecond: 100, Burst: 5, Delay: 100 * time.Microsecond})
		rt := httptestutil.InMemory(rl)
		var ok, refused int64
		start := time.Now()
		for time.Since(start) < 2*time.Second {
			status, ra, took := get(t, rt)
			switch {
			case status == http.StatusOK && took == 0:
				ok++
			case status == http.StatusTooManyRequests && ra == "1" && took == 100*time.Microsecond:
				refused++
			default:
				t.Fatalf("got %d, Retry-After %q in %v", status, ra, took)
			}
			time.Sleep(time.Millisecond - took)
		}
		// 2000 requests at 0, 1ms, ..., 1999ms: 5 at once, then one per
		// 10ms refilled from the start.
		if want := int64(5 + 199); ok != want || ok+refused != 2000 {
			t.Errorf("%d admitted and %d refused, want %d of 2000 admitted", ok, refused, want)
		}
		if s := rl.Stats(); s.Admitted != ok || s.Refused != refused || up.Stats().Requests != ok {
			t.Errorf("Stats %+v, upstream saw %d; want %d admitted, %d refused, the upstream only the admitted", s, up.Stats().Requests, ok, refused)
		}
	})
}

// TestRateLimitOptions: the defaults (a bucket of one, 429, "1"), a status
// and Retry-After of one's own or none, and a quota that never refills.
func TestRateLimitOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			name       string
			o          httptestutil.RateLimitOptions
			wantOK     int // of 10 requests at once
			status     int
			retryAfter string
		}{
			{"defaults: one at a time", httptestutil.RateLimitOptions{PerSecond: 1000}, 1, 429, "1"},
			{"a 503 and no Retry-After", httptestutil.RateLimitOptions{PerSecond: 1000, Burst: 3, Status: 503, RetryAfter: "-"}, 3, 503, ""},
			{"Retry-After of one's own", httptestutil.RateLimitOptions{PerSecond: 1000, Burst: 2, RetryAfter: "7"}, 2, 429, "7"},
			{"no refill", httptestutil.RateLimitOptions{Burst: 4}, 4, 429, "1"},
			{"a NaN rate: no refill", httptestutil.RateLimitOptions{PerSecond: math.NaN(), Burst: 4}, 4, 429, "1"},
		} {
			rt := httptestutil.InMemory(httptestutil.NewRateLimit(nil, tc.o))
			ok := 0
			for range 10 {
				status, ra, _ := get(t, rt)
				if status == http.StatusOK {
					ok++
				} else if status != tc.status || ra != tc.retryAfter {
					t.Errorf("%s: refused with %d, Retry-After %q; want %d, %q", tc.name, status, ra, tc.status, tc.retryAfter)
				}
			}
			if ok != tc.wantOK {
				t.Errorf("%s: %d of 10 at once admitted, want %d", tc.name, ok, tc.wantOK)
			}
			time.Sleep(time.Hour)
			if status, _, _ := get(t, rt); (status == http.StatusOK) != (tc.o.PerSecond > 0) {
				t.Errorf("%s: an hour later: %d", tc.name, status)
			}
		}
	})
}

// TestRateLimitRefusalCanceled: a request whose context ends during the
// refusal's delay gets no answer, and the client its context's error.
func TestRateLimitRefusalCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := httptestutil.InMemory(httptestutil.NewRateLimit(nil, httptestutil.RateLimitOptions{Burst: 0, Delay: time.Second}))
		get(t, rt) // the bucket's one token
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if _, err := rt.RoundTrip(newRequest(t, ctx, http.MethodGet, "")); err == nil {
			t.Fatal("a refusal outlived its request's context")
		}
		synctest.Wait()
	})
}

// TestLoopbackRateLimit: over a real socket, a burst of 3 admitted and the
// fourth refused with Retry-After.
func TestLoopbackRateLimit(t *testing.T) {
	srv := httptest.NewServer(httptestutil.NewRateLimit(nil, httptestutil.RateLimitOptions{PerSecond: 0.001, Burst: 3}))
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	var got []int
	for range 4 {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		got = append(got, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After %q, want 1", resp.Header.Get("Retry-After"))
		}
	}
	if got[0] != 200 || got[1] != 200 || got[2] != 200 || got[3] != 429 {
		t.Errorf("statuses %v, want 200 200 200 429", got)
	}
}
