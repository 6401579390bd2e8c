package transport

import (
	"context"
	"errors"
	"io"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// reported makes one call of rt to url with a Report in its context, and
// returns the Report as RoundTrip left it, the response's body read and
// closed.
func reported(t *testing.T, rt http.RoundTripper, url string) (Report, error) {
	t.Helper()
	var rep Report
	req, _ := http.NewRequestWithContext(WithReport(t.Context(), &rep), http.MethodGet, url, nil)
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return rep, err
}

// ignoreRefusal leaves Refusal out of a comparison: the tests check it
// apart, with errors.Is.
var ignoreRefusal = cmpopts.IgnoreFields(Report{}, "Refusal")

func TestReportRetriesRunOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Faults: []httptestutil.Fault{{Probability: 1, Status: 503}}})
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: retrySet()})
		got, err := reported(t, tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		want := Report{RoundTrips: 1, Outcome: policy.Failure, StatusCode: 503, WireAttempts: 3, Retries: 2, Exhausted: true}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Report (-want +got):\n%s", diff)
		}
	})
}

func TestReportHedgeWon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		slow := int64(31) // the first leg of the call after 30 warm ones
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.LatencyFunc(func(*rand.Rand) time.Duration {
			if n.Add(1) == slow {
				return time.Second
			}
			return 10 * time.Millisecond
		})})
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: hedgeSet()})
		warm(t, tr, 30)
		got, err := reported(t, tr, "http://up.test/")
		if err != nil {
			t.Fatal(err)
		}
		want := Report{RoundTrips: 1, Outcome: policy.Success, StatusCode: 200, WireAttempts: 2, Hedges: 1, HedgeWon: true}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Report (-want +got):\n%s", diff)
		}
	})
}

// A hedge that loses is still on the wire as RoundTrip returns: it ends
// on its own goroutine afterwards, and must not touch the Report, which
// the caller reads meanwhile (the race detector watches).
func TestReportLoserFinishingLateLeavesItAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		var ended atomic.Int64 // legs back from the upstream
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.LatencyFunc(func(*rand.Rand) time.Duration {
			switch n.Add(1) {
			case 31:
				return 30 * time.Millisecond // the first leg: slower than the threshold, faster than the hedge
			case 32:
				return time.Second // the hedge, which loses
			}
			return 10 * time.Millisecond
		})})
		inner := up.RoundTripper()
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			defer ended.Add(1)
			return inner.RoundTrip(r)
		})
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet()})
		warm(t, tr, 30)
		ended.Store(0)

		rep := new(Report)
		req, _ := http.NewRequestWithContext(WithReport(t.Context(), rep), http.MethodGet, "http://up.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ended.Load() != 1 {
			t.Fatalf("%d legs back as RoundTrip returned, want 1: the hedge must still be on the wire", ended.Load())
		}
		want := Report{RoundTrips: 1, Outcome: policy.Success, StatusCode: 200, WireAttempts: 2, Hedges: 1}
		if diff := cmp.Diff(want, *rep); diff != "" {
			t.Errorf("Report (-want +got):\n%s", diff)
		}
		for range 20 { // reads interleaved with the loser's end
			time.Sleep(100 * time.Millisecond)
			if *rep != want {
				t.Fatalf("Report changed after RoundTrip returned: %+v", *rep)
			}
		}
		synctest.Wait()
		if ended.Load() != 2 {
			t.Fatalf("%d legs back, want 2", ended.Load())
		}
		if *rep != want {
			t.Errorf("Report after the loser ended: %+v, want %+v", *rep, want)
		}
	})
}

func TestReportBreakerRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Faults: []httptestutil.Fault{{Probability: 1, Status: 503}}})
		set := retrySet()
		set.Breaker = &policy.Breaker{ConsecutiveFailures: 2}
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: set})

		// Two failures open the breaker, which refuses the second retry:
		// the last answer stands.
		got, err := reported(t, tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		want := Report{RoundTrips: 1, Outcome: policy.Failure, StatusCode: 503, WireAttempts: 2, Retries: 1, Skipped: policy.SkipGate, Gate: policy.GateBreaker}
		if diff := cmp.Diff(want, got, ignoreRefusal); diff != "" {
			t.Errorf("the retry refused: Report (-want +got):\n%s", diff)
		}
		if !errors.Is(got.Refusal, policy.ErrCircuitOpen) || got.Refusal.Gate != policy.GateBreaker {
			t.Errorf("the retry refused: Refusal %v, want the breaker's ErrCircuitOpen", got.Refusal)
		}

		// Open: the next call is refused before any attempt.
		got, err = reported(t, tr, "http://a.test/")
		var rej *policy.RejectedError
		if !errors.As(err, &rej) || got.Refusal != rej {
			t.Fatalf("the call refused: Refusal %v, error %v; want the error returned", got.Refusal, err)
		}
		want = Report{RoundTrips: 1, Outcome: policy.Rejected, Gate: policy.GateBreaker}
		if diff := cmp.Diff(want, got, ignoreRefusal); diff != "" {
			t.Errorf("the call refused: Report (-want +got):\n%s", diff)
		}
		if !errors.Is(got.Refusal, policy.ErrCircuitOpen) {
			t.Errorf("the call refused: Refusal %v, want ErrCircuitOpen", got.Refusal)
		}
	})
}

func TestReportBudgetSkip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{Faults: []httptestutil.Fault{{Probability: 1, Status: 503}}})
		set := retrySet()
		set.Budget = policy.Budget{Max: 1, MinPerSecond: -1, Ratio: 0.01}
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: set})
		// One token: attempt, retry (token spent), then the budget refuses.
		got, err := reported(t, tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		want := Report{RoundTrips: 1, Outcome: policy.Failure, StatusCode: 503, WireAttempts: 2, Retries: 1, Skipped: policy.SkipBudget}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Report (-want +got):\n%s", diff)
		}
	})
}

// http.Client follows a redirect with a second RoundTrip under the same
// context: the Report describes the last hop, and counts both.
func TestReportRedirect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{})
		var olds atomic.Int64
		mux := http.NewServeMux()
		mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
			if olds.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable) // retried, then redirected
				return
			}
			http.Redirect(w, r, "/new", http.StatusFound)
		})
		mux.Handle("/new", up)
		tr := mustNew(t, Config{Base: httptestutil.InMemory(mux), Policies: retrySet()})
		client := &http.Client{Transport: tr}

		var rep Report
		req, _ := http.NewRequestWithContext(WithReport(t.Context(), &rep), http.MethodGet, "http://a.test/old", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Request.URL.Path != "/new" {
			t.Fatalf("ended at %s, want /new", resp.Request.URL)
		}
		// The first hop's retry is not in it: the second overwrote it.
		want := Report{RoundTrips: 2, Outcome: policy.Success, StatusCode: 200, WireAttempts: 1}
		if diff := cmp.Diff(want, rep); diff != "" {
			t.Errorf("Report (-want +got):\n%s", diff)
		}
	})
}

func TestReportEarlyRefusals(t *testing.T) {
	tr := mustNew(t, Config{Base: okBase{}, Policies: retrySet()})
	rep := Report{RoundTrips: 4, Retries: 9}
	ctx, cancel := context.WithCancel(WithReport(t.Context(), &rep))
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if want := (Report{RoundTrips: 5, Outcome: policy.Canceled}); rep != want {
		t.Errorf("a done context: Report %+v, want %+v", rep, want)
	}

	ctx = WithOverride(WithReport(t.Context(), &rep), Override{Attempts: -1})
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a negative Override.Attempts: no error")
	}
	if want := (Report{RoundTrips: 6}); rep != want {
		t.Errorf("a bad Override: Report %+v, want %+v", rep, want)
	}

	// A nil Report shadows an outer one.
	rep = Report{}
	req, _ = http.NewRequestWithContext(WithReport(WithReport(t.Context(), &rep), nil), http.MethodGet, "http://a.test/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if rep != (Report{}) {
		t.Errorf("under WithReport(ctx, nil): Report %+v, want it untouched", rep)
	}
}

// TestReportAllocatesNothing holds a call with a Report to the
// allocations of the same call without one (TestAllocationBudgets holds
// those): writing a Report allocates nothing.
func TestReportAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	plain, hedging := plainTransport, hedgingTransport
	for _, tc := range []struct {
		name string
		new  func(testing.TB) *Transport
	}{
		{"no policy", plain(policy.Set{})},
		{"retry", plain(policy.Set{Retry: &policy.Retry{}})},
		{"retry+breaker+timeout", plain(policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Hour}})},
		{"hedge armed", hedging(policy.Set{Hedge: &policy.Hedge{}})},
		{"every policy, nothing firing", hedging(fullSet())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := tc.new(t)
			var rep Report
			allocs := func(ctx context.Context) float64 {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
				call := func() {
					resp, err := rt.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				call() // the key's state
				return testing.AllocsPerRun(200, call)
			}
			without := allocs(context.Background())
			with := allocs(WithReport(context.Background(), &rep))
			if with != without {
				t.Errorf("%v allocations a call with a Report, %v without", with, without)
			}
			if rep.RoundTrips < 200 || rep.Outcome != policy.Success || rep.WireAttempts != 1 {
				t.Errorf("Report %+v after the calls", rep)
			}
		})
	}
}

// With Replicas, a call whose retries go to other lanes reports each lane
// it used, and the lane of the answer it returned, as AttemptDone named it.
func TestReportLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		var last atomic.Value // string: the Lane of the last AttemptDone
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Budget:   policy.Budget{Ratio: -1}, // off: every retry is sent
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Replicas: &policy.Replicas{Endpoints: Static(four...), MaxEjected: -1},
			},
			Observer: &policy.Observer{AttemptDone: func(a policy.AttemptInfo) { last.Store(a.Lane) }},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.status.Store(http.StatusServiceUnavailable)
		}
		got, err := reported(t, rt, "http://api/")
		if err != nil {
			t.Fatal(err)
		}
		if bits.OnesCount64(got.Lanes) != 3 || got.WireAttempts != 3 || !got.Exhausted {
			t.Errorf("Report %+v, want three attempts on three lanes", got)
		}
		if lane, _ := last.Load().(string); got.Lane == "" || got.Lane != lane {
			t.Errorf("Report.Lane %q, want the last attempt's, %q", got.Lane, lane)
		}
	})
}
