package httptestutil_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// TestOverloadRefusesWhileOverloaded: in virtual time, an overload of 2s
// answers every request 503 with Retry-After: 1 until exactly 2s have
// passed, and passes requests on before and after; Begin(0) ends one
// early.
func TestOverloadRefusesWhileOverloaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{})
		ov := httptestutil.NewOverload(up, httptestutil.OverloadOptions{})
		rt := httptestutil.InMemory(ov)
		if status, _, _ := get(t, rt); status != http.StatusOK || ov.Overloaded() {
			t.Fatalf("before the overload: %d", status)
		}
		ov.Begin(2 * time.Second)
		start := time.Now()
		for _, at := range []time.Duration{0, time.Second, 2*time.Second - time.Nanosecond} {
			time.Sleep(at - time.Since(start))
			status, ra, took := get(t, rt)
			if status != http.StatusServiceUnavailable || ra != "1" || took != 0 || !ov.Overloaded() {
				t.Errorf("at +%v of the overload: %d, Retry-After %q, in %v", at, status, ra, took)
			}
		}
		time.Sleep(2*time.Second - time.Since(start))
		if status, _, _ := get(t, rt); status != http.StatusOK || ov.Overloaded() {
			t.Errorf("when the overload has run out: %d", status)
		}
		ov.Begin(time.Hour)
		ov.Begin(0)
		if status, _, _ := get(t, rt); status != http.StatusOK {
			t.Errorf("after Begin(0): %d", status)
		}
		if s := ov.Stats(); s != (httptestutil.OverloadStats{Served: 3, Refused: 3}) || up.Stats().Requests != 3 {
			t.Errorf("Stats %+v, upstream saw %d; want 3 served, 3 refused", s, up.Stats().Requests)
		}
	})
}

// TestOverloadOptions: a refusal of one's own, after a delay.
func TestOverloadOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ov := httptestutil.NewOverload(nil, httptestutil.OverloadOptions{Status: 429, RetryAfter: "-", Delay: time.Millisecond})
		ov.Begin(time.Minute)
		if status, ra, took := get(t, httptestutil.InMemory(ov)); status != 429 || ra != "" || took != time.Millisecond {
			t.Errorf("got %d, Retry-After %q in %v; want 429, none, in 1ms", status, ra, took)
		}
	})
}
