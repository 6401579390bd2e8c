package transport_test

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestPropagatedDeadlineLoopback (opt-in: RESILIX_PROPAGATE=1, or a
// number of calls) measures, over loopback sockets, where the deadline
// that admission gives the next tier falls against the caller's own, on
// the same clock: calls with deadlines from 100ms to 200ms, a fraction of
// a millisecond at random, from 2 callers through a transport with
// Propagate to an admission handler, on kept connections, on a new
// connection each, and on one connection the callers take turns on
// (MaxConnsPerHost 1, the handler holding it 8ms after it measured: each
// call waits for the other's). The target: no next-tier deadline later than its
// caller's. It prints how much earlier they came (the time left is
// floored to the millisecond and a transit margin taken off it).
//
//	RESILIX_PROPAGATE=1 go test -count=1 -run TestPropagatedDeadlineLoopback -v ./transport/
func TestPropagatedDeadlineLoopback(t *testing.T) {
	n := 2000
	switch v := os.Getenv("RESILIX_PROPAGATE"); v {
	case "":
		t.Skip("a loopback measurement of the propagated deadline; set RESILIX_PROPAGATE=1 (or a number of calls) to run it")
	case "1":
	default:
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("RESILIX_PROPAGATE=%q: want 1 or a number of calls", v)
		}
	}
	tb := &figureTable{cols: []string{"connections", "calls", "later", "latest", "earliest", "median", "p99"}}
	for _, mode := range []connMode{connsKept, connsNew, connsOne} {
		later, early := propagateLoopback(t, n, mode)
		slices.Sort(early)
		name := [...]string{connsKept: "kept", connsNew: "new each call", connsOne: "one (MaxConnsPerHost 1)"}[mode]
		q := func(f float64) string { return early[int(f*float64(len(early)-1))].String() }
		latest := "-"
		if len(later) > 0 {
			latest = slices.Max(later).String()
		}
		tb.row(name, strconv.Itoa(n), strconv.Itoa(len(later)), latest, q(0), q(0.5), q(0.99))
		tb.check(len(later) == 0, "%s connections: %d of %d next-tier deadlines later than the caller's, the latest by %s", name, len(later), n, latest)
	}
	tb.note("earliest, median, p99: how much earlier than the caller's the next tier's deadline is, of those not later")
	tb.log(t, "propagated deadlines over loopback")
}

// connMode is how the calls of propagateLoopback get their connections.
type connMode int

const (
	connsKept connMode = iota // kept between calls
	connsNew                  // a new one each call
	connsOne                  // one, kept, for both callers (MaxConnsPerHost 1)
)

// oneConnHold is how long the handler holds the one connection of
// connsOne after it measured, longer than the transit margin, so that a
// call that waits for it would get a later deadline were the wait not
// left out.
const oneConnHold = 8 * time.Millisecond

// propagateLoopback makes n calls and returns by how much each next-tier
// deadline was later than its caller's, for those that were, and by how
// much earlier it was, for the others.
func propagateLoopback(t *testing.T, n int, mode connMode) (later, early []time.Duration) {
	var mu sync.Mutex
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := r.Context().Deadline()
		if !ok {
			t.Error("no deadline in the next tier's context")
			return
		}
		want, _ := strconv.ParseInt(r.Header.Get("X-Caller-Deadline"), 10, 64)
		d := got.Sub(time.Unix(0, want))
		mu.Lock()
		if d > 0 {
			later = append(later, d)
		} else {
			early = append(early, -d)
		}
		mu.Unlock()
		if mode == connsOne {
			time.Sleep(oneConnHold)
		}
	})
	h, err := admission.Handler(next, admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.DisableKeepAlives = mode == connsNew
	if mode == connsOne {
		base.MaxConnsPerHost = 1
	}
	defer base.CloseIdleConnections()
	tr, err := transport.New(transport.Config{Base: base, Policies: policy.Set{Propagate: true}})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	calls := make(chan int)
	for w := range 2 {
		rng := rand.New(rand.NewPCG(uint64(w), 1))
		wg.Go(func() {
			for range calls {
				dl := time.Now().Add(100*time.Millisecond + time.Duration(rng.Int64N(int64(100*time.Millisecond))))
				ctx, cancel := context.WithDeadline(context.Background(), dl)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				req.Header.Set("X-Caller-Deadline", strconv.FormatInt(dl.UnixNano(), 10))
				resp, err := c.Do(req)
				if err != nil {
					t.Error(err)
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
			}
		})
	}
	for i := range n {
		calls <- i
	}
	close(calls)
	wg.Wait()
	if len(later)+len(early) != n {
		t.Fatalf("%d of %d calls measured", len(later)+len(early), n)
	}
	return later, early
}
