package slogobserver_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/slogobserver"
	"github.com/resilix/resilix/transport"
)

// newClient returns a client over a Transport with base, the set and an
// Observer logging to a recorder at Debug.
func newClient(t *testing.T, base http.RoundTripper, set policy.Set, opts slogobserver.Options) (*http.Client, *recorder) {
	t.Helper()
	rec := &recorder{level: slog.LevelDebug}
	tr, err := transport.New(transport.Config{
		Base:     base,
		Policies: set,
		Observer: slogobserver.New(slog.New(rec), opts),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr}, rec
}

// get sends a GET to url under a context with the request id id, and
// returns its status, 0 with an error.
func get(t *testing.T, c *http.Client, url, id string, header ...string) (int, error) {
	t.Helper()
	ctx := context.WithValue(context.Background(), requestIDKey{}, id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// check returns the first record of recs with msg whose attributes
// include want, at level, and says so when none is.
func check(t *testing.T, recs []record, level slog.Level, msg string, want map[string]string) record {
	t.Helper()
	for _, r := range with(recs, msg) {
		if r.Level != level {
			t.Errorf("%q at %v, want %v", msg, r.Level, level)
			return r
		}
		ok := true
		for k, v := range want {
			if r.Attrs[k] != v {
				ok = false
			}
		}
		if ok {
			return r
		}
	}
	t.Errorf("no %v %q with %v in:%s", level, msg, want, messages(recs))
	return record{}
}

// TestSlogStorm drives a key through a 503 storm: its attempts fail and
// are retried until the budget is spent, its breaker opens and refuses
// calls, and, once the upstream recovers, it half-opens and closes. Each
// step is logged once, at its level, with the request's context, and the
// calls that succeed log nothing else.
func TestSlogStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
		})
		c, rec := newClient(t, up.RoundTripper(), policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond},
			Budget:  policy.Budget{Max: 2, MinPerSecond: -1},
			Breaker: &policy.Breaker{ConsecutiveFailures: 8, FirstOpenFor: time.Second, OpenFor: time.Second},
		}, slogobserver.Options{})

		var refused bool
		for i := 0; i < 20 && !refused; i++ {
			_, err := get(t, c, "http://api.test/", "storm")
			refused = err != nil && errorsIsRejected(err)
		}
		if !refused {
			t.Fatal("the breaker never refused a call")
		}
		recs := rec.take()
		for _, r := range recs {
			if r.ReqID != "storm" {
				t.Errorf("%q logged without the request's context", r.Msg)
			}
		}
		check(t, recs, slog.LevelDebug, "attempt failed", map[string]string{
			"key": "api.test", "kind": "first", "attempt": "1", "outcome": "failure", "http.response.status_code": "503",
		})
		check(t, recs, slog.LevelDebug, "attempt failed", map[string]string{
			"key": "api.test", "kind": "retry", "attempt": "2", "outcome": "failure", "http.response.status_code": "503",
		})
		check(t, recs, slog.LevelDebug, "retry skipped", map[string]string{
			"key": "api.test", "reason": "budget", "priority": "critical",
		})
		check(t, recs, slog.LevelDebug, "retry skipped", map[string]string{
			"key": "api.test", "reason": "gate", "gate": "breaker",
		})
		check(t, recs, slog.LevelWarn, "breaker opened", map[string]string{
			"key": "api.test", "from": "closed", "to": "open",
		})
		check(t, recs, slog.LevelDebug, "refused", map[string]string{
			"key": "api.test", "kind": "first", "gate": "breaker", "priority": "critical", "tenant.heavy": "false",
		})
		if n := len(with(recs, "breaker opened")); n != 1 {
			t.Errorf("breaker opened logged %d times, want 1", n)
		}
		if n, m := len(with(recs, "attempt failed")), int(up.Stats().Requests); n != m {
			t.Errorf("%d attempt failed records for %d requests the upstream saw", n, m)
		}

		// The upstream recovers; past the opening, a probe half-opens the
		// breaker and its success closes it. The calls after log nothing.
		up.SetFaults()
		time.Sleep(2 * time.Second)
		for range 5 {
			if code, err := get(t, c, "http://api.test/", "recovered"); code != http.StatusOK {
				t.Fatalf("after recovery: %d, %v", code, err)
			}
		}
		recs = rec.take()
		check(t, recs, slog.LevelInfo, "breaker half-open", map[string]string{"key": "api.test", "from": "open", "to": "half_open"})
		check(t, recs, slog.LevelInfo, "breaker closed", map[string]string{"key": "api.test", "from": "half_open", "to": "closed"})
		if len(recs) != 2 {
			t.Errorf("after recovery, want the two transitions only:%s", messages(recs))
		}
	})
}

// TestSlogHedges: a key's first calls warm its window (hedges suppressed,
// at Debug), then a slow call is hedged, the hedge wins and the first leg
// is discarded, all at Debug: a handler at Info logs none of it.
func TestSlogHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		up := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch n.Add(1) {
			case 6: // slow: stays until resilix cancels it
				<-r.Context().Done()
			case 7: // the hedge: answers at once
			default:
				time.Sleep(10 * time.Millisecond)
			}
		}))
		c, rec := newClient(t, up, policy.Set{Hedge: &policy.Hedge{MinSamples: 5}}, slogobserver.Options{})
		for range 6 {
			if code, err := get(t, c, "http://catalog.test/", "hedged"); code != http.StatusOK {
				t.Fatalf("%d, %v", code, err)
			}
		}
		synctest.Wait() // the discarded leg reports from its own goroutine
		recs := rec.take()
		check(t, recs, slog.LevelDebug, "hedge suppressed", map[string]string{"key": "catalog.test", "reason": "warming", "priority": "critical"})
		started := check(t, recs, slog.LevelDebug, "hedge started", map[string]string{"key": "catalog.test", "attempt": "2", "priority": "critical"})
		won := check(t, recs, slog.LevelDebug, "hedge won", map[string]string{"key": "catalog.test", "attempt": "2", "priority": "critical"})
		// The threshold is the window's p95, about the 10ms the calls took.
		if ms, err := strconv.ParseFloat(started.Attrs["threshold_ms"], 64); err != nil || ms < 10 || ms > 11 {
			t.Errorf("hedge started with threshold_ms %q, want about 10", started.Attrs["threshold_ms"])
		}
		if won.Attrs["threshold_ms"] != started.Attrs["threshold_ms"] {
			t.Errorf("hedge won with threshold_ms %q, started with %q", won.Attrs["threshold_ms"], started.Attrs["threshold_ms"])
		}
		check(t, recs, slog.LevelDebug, "attempt discarded", map[string]string{"key": "catalog.test", "kind": "first", "attempt": "1", "outcome": "discarded"})
		for _, r := range recs {
			if r.Level > slog.LevelDebug {
				t.Errorf("%v %q: hedging logs at Debug only", r.Level, r.Msg)
			}
			if r.ReqID != "hedged" {
				t.Errorf("%q logged without the request's context", r.Msg)
			}
		}
		if len(with(recs, "hedge started")) != 1 || len(with(recs, "hedge won")) != 1 {
			t.Errorf("want one hedge started and won:%s", messages(recs))
		}
	})
}

// TestSlogMalformedPriority: a priority header that does not parse is
// logged, at Debug, with its name and value, and the call goes on.
func TestSlogMalformedPriority(t *testing.T) {
	c, rec := newClient(t, httptestutil.InMemory(http.NotFoundHandler()), policy.Set{}, slogobserver.Options{})
	if code, err := get(t, c, "http://api.test/", "bad-header", "Resilix-Priority", "urgent!"); code != http.StatusNotFound {
		t.Fatalf("%d, %v", code, err)
	}
	recs := rec.take()
	check(t, recs, slog.LevelDebug, "malformed header", map[string]string{
		"key": "api.test", "http.header": "Resilix-Priority", "value": "urgent!",
	})
	if len(recs) != 1 || recs[0].ReqID != "bad-header" {
		t.Errorf("want the one record, with the request's context:%s", messages(recs))
	}
}

// TestSlogSuccessPath: calls that succeed at once log nothing, even at
// Debug, unless Options asks for calls and attempts.
func TestSlogSuccessPath(t *testing.T) {
	base := httptestutil.InMemory(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	set := policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}}
	c, rec := newClient(t, base, set, slogobserver.Options{})
	for range 10 {
		if code, err := get(t, c, "http://api.test/", "ok"); code != http.StatusOK {
			t.Fatalf("%d, %v", code, err)
		}
	}
	if recs := rec.take(); len(recs) != 0 {
		t.Errorf("the success path logged:%s", messages(recs))
	}

	c, rec = newClient(t, base, set, slogobserver.Options{Calls: true, Attempts: true})
	if code, err := get(t, c, "http://api.test/", "ok"); code != http.StatusOK {
		t.Fatalf("%d, %v", code, err)
	}
	recs := rec.take()
	check(t, recs, slog.LevelDebug, "attempt done", map[string]string{
		"key": "api.test", "kind": "first", "attempt": "1", "outcome": "success", "http.response.status_code": "200",
	})
	check(t, recs, slog.LevelDebug, "call done", map[string]string{
		"key": "api.test", "outcome": "success", "priority": "critical", "attempts": "1", "http.response.status_code": "200",
	})
	if len(recs) != 2 {
		t.Errorf("want an attempt and a call:%s", messages(recs))
	}
}

func errorsIsRejected(err error) bool { return errors.Is(err, policy.ErrRejected) }
