package main

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/internal/fixedhedge"
	"github.com/resilix/resilix/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inMemory serves the upstream without sockets, so that the demo can run in
// a synctest bubble, where its latencies are exact.
func inMemory(up *httptestutil.Upstream) (string, func() http.RoundTripper, func()) {
	return "http://upstream.test", up.RoundTripper, func() {}
}

// TestDemo runs the demo in virtual time, at its own size, and checks what
// its table claims. Over loopback the same figures hold on an idle machine,
// but a loaded one's stalls land in the tail the table is about. The size
// matters: the brownout's first calls meet the calm threshold, rescanned
// at most every 0.94s, and then a window still mostly calm, so that the
// transition hedges nearly every call until the quantile catches up; the
// hedges that lose stay spent, and the budget caps them at its Ratio of
// the calls (20%; 14% over the demo's 1500 brownout calls). The fixed
// delay, set to the calm threshold, hedges every brownout call: about 100%
// extra, in virtual time as on any machine, far from resilix's Ratio at
// most.
func TestDemo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rows, err := run(io.Discard, 3000, inMemory)
		if err != nil {
			t.Fatal(err)
		}
		plain, hedged, brownout, fixed := rows[0], rows[1], rows[2], rows[3]
		t.Logf("p99 %v without hedging, %v with; extra wire calls %.1f%%, %.1f%% in the brownout, %.1f%% with a fixed delay",
			plain.res.Quantile(0.99), hedged.res.Quantile(0.99), 100*hedged.extra(), 100*brownout.extra(), 100*fixed.extra())
		if p, h := plain.res.Quantile(0.99), hedged.res.Quantile(0.99); h*3 > p {
			t.Errorf("p99 %v with hedging vs %v without: want the slow mode cut by far more than 3x", h, p)
		}
		if e := hedged.extra(); e > 0.10 {
			t.Errorf("hedging cost %.1f%% extra wire calls, want near 5%%", 100*e)
		}
		if e, most := brownout.extra(), (policy.Budget{}).WithDefaults().Ratio; e > most {
			t.Errorf("the brownout cost %.1f%% extra wire calls; the budget should keep it within its Ratio, %.0f%%", 100*e, 100*most)
		}
		// Every brownout call is slower than the calm threshold, so a
		// fixed delay set to it hedges nearly every call: the wide margin
		// over resilix's Ratio at most is the demo's point.
		if e := fixed.extra(); e < 0.90 {
			t.Errorf("the fixed delay cost %.1f%% extra wire calls in the brownout, want nearly every call hedged (>= 90%%)", 100*e)
		}
		for _, r := range rows {
			if r.res.Failed > 0 {
				t.Errorf("%s, %s: %d of %d calls failed", r.phase, r.client, r.res.Failed, len(r.res.Latencies))
			}
		}
	})
}

// TestDemoOverLoopback runs the demo as make demo does, on real sockets,
// small, and checks only that every call got its answer: its latencies are
// the machine's as much as the upstream's.
func TestDemoOverLoopback(t *testing.T) {
	rows, err := run(io.Discard, 200, loopback)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.res.Failed > 0 {
			t.Errorf("%s, %s: %d of %d calls failed", r.phase, r.client, r.res.Failed, len(r.res.Latencies))
		}
	}
}

// TestFixedDelay checks the comparison's hedger does what the table says
// it does: one wire call when the answer beats the delay; otherwise a
// second copy, the first answer wins, and the loser is cancelled and its
// response closed.
func TestFixedDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var copies atomic.Int32
		var slow atomic.Int64          // the latency of each call's first copy; the second takes 1ms
		lostCtx := make(chan error, 1) // the slow copy's context when it answered
		wire := httptestutil.Track(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if copies.Add(1)%2 == 0 {
				time.Sleep(time.Millisecond)
				return okResponse(r), nil
			}
			// The first copy ignores cancellation, so that it answers
			// after losing and the hedger has a response to close.
			time.Sleep(time.Duration(slow.Load()))
			if d := time.Duration(slow.Load()); d > 10*time.Millisecond {
				lostCtx <- r.Context().Err()
			}
			return okResponse(r), nil
		}))
		client := &http.Client{Transport: fixedhedge.Hedger{Base: wire, Delay: 10 * time.Millisecond}}
		get := func() time.Duration {
			start := time.Now()
			resp, err := client.Get("http://upstream.test/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return time.Since(start)
		}

		slow.Store(int64(5 * time.Millisecond))
		if d := get(); d != 5*time.Millisecond || wire.Requests() != 1 {
			t.Errorf("a first copy of 5ms, before the 10ms delay: took %v and %d wire calls, want 5ms and 1", d, wire.Requests())
		}

		copies.Store(0)
		slow.Store(int64(time.Second))
		if d := get(); d != 11*time.Millisecond || wire.Requests() != 3 {
			t.Errorf("a first copy of 1s: took %v and %d wire calls in all, want 11ms (the delay, then the fast copy) and 3", d, wire.Requests())
		}
		if err := <-lostCtx; err != context.Canceled {
			t.Errorf("the losing copy's context: %v, want it cancelled", err)
		}
		wire.Wait()
		synctest.Wait()
		if n := wire.Open(); n != 0 {
			t.Errorf("%d response bodies left open, want the loser's closed too", n)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func okResponse(r *http.Request) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{}, Body: http.NoBody, Request: r}
}
