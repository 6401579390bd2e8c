package transport

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// Integration tests over real loopback sockets: few, fast, and asserting on
// counts, never on times.

func loopback(t *testing.T, o httptestutil.Options) (*httptestutil.Upstream, string) {
	t.Helper()
	u := httptestutil.NewUpstream(o)
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return u, srv.URL
}

func trackedTransport(t *testing.T, set policy.Set) (*Transport, *httptestutil.Tracker) {
	t.Helper()
	base := cleanhttp.DefaultPooledTransport()
	t.Cleanup(base.CloseIdleConnections)
	tracker := httptestutil.Track(base)
	return mustNew(t, Config{Base: tracker, Policies: set}), tracker
}

var always503 = []httptestutil.Fault{{Probability: 1, Status: 503}}

func TestLoopbackPlainPostReachesA503UpstreamOnce(t *testing.T) {
	up, url := loopback(t, httptestutil.Options{Faults: always503})
	tr, tracker := trackedTransport(t, retrySet())
	resp, err := (&http.Client{Transport: tr}).Post(url, "text/plain", strings.NewReader("charge=1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || up.Stats().ByMethod["POST"] != 1 {
		t.Fatalf("status %d, POSTs received %d; want one 503", resp.StatusCode, up.Stats().ByMethod["POST"])
	}
	if tracker.Open() != 0 {
		t.Fatalf("%d response bodies left open", tracker.Open())
	}
}

func TestLoopbackRepeatablePostCarriesItsBodyEveryTime(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789"), 1000) // 10 KB, more than one read
	for _, mark := range []string{"Idempotency-Key", "MarkRepeatable"} {
		t.Run(mark, func(t *testing.T) {
			up, url := loopback(t, httptestutil.Options{Faults: always503, KeepBodies: 10})
			tr, tracker := trackedTransport(t, retrySet())
			ctx := t.Context()
			if mark == "MarkRepeatable" {
				ctx = MarkRepeatable(ctx)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
			if mark == "Idempotency-Key" {
				req.Header.Set("Idempotency-Key", "order-42")
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			st := up.Stats()
			if st.ByMethod["POST"] != 3 || len(st.Bodies) != 3 {
				t.Fatalf("POSTs %d, bodies kept %d; want 3", st.ByMethod["POST"], len(st.Bodies))
			}
			for i, b := range st.Bodies {
				if !bytes.Equal(b, payload) {
					t.Errorf("attempt %d carried %d bytes, want the whole %d", i+1, len(b), len(payload))
				}
			}
			// Superseded bodies are drained and closed in the background.
			waitFor(5*time.Second, func() bool { return tracker.BodiesClosed() == 3 })
			if tracker.Responses() != 3 || tracker.BodiesClosed() != 3 {
				t.Fatalf("responses %d, bodies closed %d: every superseded body must be closed",
					tracker.Responses(), tracker.BodiesClosed())
			}
		})
	}
}

func TestLoopbackBudgetsArePerHost(t *testing.T) {
	// A budget of one token and no refill: host a spends it, host b still
	// has its own.
	set := retrySet()
	set.Budget = policy.Budget{Max: 1, Ratio: 0.001, MinPerSecond: -1}
	upA, urlA := loopback(t, httptestutil.Options{Faults: always503})
	upB, urlB := loopback(t, httptestutil.Options{Faults: always503})
	tr, tracker := trackedTransport(t, set)
	c := &http.Client{Transport: tr}
	for _, url := range []string{urlA, urlA, urlA, urlB} {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// a: 2 wire calls for the first call (1 retry), then 1 each. b: 2.
	if a, b := upA.Stats().Requests, upB.Stats().Requests; a != 4 || b != 2 {
		t.Fatalf("requests a=%d b=%d, want 4 and 2", a, b)
	}
	// Superseded bodies are drained and closed in the background.
	waitFor(5*time.Second, func() bool { return tracker.Open() == 0 })
	if tracker.Open() != 0 {
		t.Fatalf("%d bodies open", tracker.Open())
	}
}

func TestLoopbackUntrustedCertificateIsNotRetried(t *testing.T) {
	srv := httptest.NewUnstartedServer(httptestutil.NewUpstream(httptestutil.Options{}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is the point
	srv.StartTLS()
	defer srv.Close()
	base := cleanhttp.DefaultPooledTransport() // does not trust the test server's certificate
	defer base.CloseIdleConnections()
	var skips []policy.RetrySkip
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: &policy.Observer{
		RetrySkipped: func(s policy.RetrySkip) { skips = append(skips, s) },
	}})
	_, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
	if len(skips) != 1 || skips[0].Reason != policy.SkipPermanent || skips[0].Attempt != 1 {
		t.Fatalf("skips %+v: a certificate error is not retried", skips)
	}
}

// TestLoopbackHedgeWaitsForTheBody: over real sockets, a PUT whose body has
// no GetBody and trickles in past the hedge threshold is hedged once
// net/http has written the whole body for the first leg, and both legs'
// handlers receive it byte for byte; the hedge, answered as soon as the
// first leg's handler has the body, wins. (net/http reads the body to its
// end before it writes the last of it, so the hedge may go before the
// first leg's server has it all; the hedge's answer waits for it, so that
// the first leg, cancelled at once as the loser, is not cut short by a
// busy machine.)
func TestLoopbackHedgeWaitsForTheBody(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	var mu sync.Mutex
	bodies := map[string][]byte{}
	firstRead := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			return // the warm-up's GETs
		}
		b, err := io.ReadAll(r.Body)
		n := r.Header.Get("Resilix-Attempt")
		mu.Lock()
		bodies[n] = b
		mu.Unlock()
		if err != nil {
			t.Errorf("attempt %s: reading the body: %v", n, err)
		}
		if n == "1" {
			close(firstRead)
			<-r.Context().Done() // slow: held until the hedge wins and it is cancelled
			return
		}
		select {
		case <-firstRead:
		case <-time.After(5 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	// The PUT's hedge events; the warm-up's GETs may be hedged too, when
	// loopback's latency jitters.
	type putKey struct{}
	putCtx, cancel := context.WithTimeout(context.WithValue(t.Context(), putKey{}, true), 5*time.Second)
	defer cancel() // the bound on a first leg never hedged
	var started, pending atomic.Int32
	won := make(chan struct{}, 2)
	obs := &policy.Observer{
		HedgeStarted: func(h policy.HedgeInfo) {
			if h.Context.Value(putKey{}) != nil {
				started.Add(1)
			}
		},
		HedgeWon: func(h policy.HedgeInfo) {
			if h.Context.Value(putKey{}) != nil {
				won <- struct{}{}
			}
		},
		HedgeSuppressed: func(s policy.HedgeSuppression) {
			if s.Context.Value(putKey{}) != nil && s.Reason == policy.HedgeBodyPending {
				pending.Add(1)
			}
		},
	}
	base := cleanhttp.DefaultPooledTransport()
	defer base.CloseIdleConnections()
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{Propagate: true, Hedge: &policy.Hedge{MaxConcurrent: 2}}, Observer: obs})
	for range 30 {
		resp, err := get(t, t.Context(), tr, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	req, _ := http.NewRequestWithContext(putCtx, http.MethodPut, srv.URL, trickle(payload))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.Header.Get("Resilix-Attempt") != "2" {
		t.Errorf("answered by attempt %q, want the hedge, 2", resp.Request.Header.Get("Resilix-Attempt"))
	}
	select {
	case <-won: // reported by the hedge's goroutine, perhaps after the answer
	case <-time.After(10 * time.Second):
		t.Error("no hedge won")
	}
	srv.Close() // waits for the first leg's handler, cancelled
	if started.Load() != 1 || len(won) != 0 || pending.Load() != 0 {
		t.Errorf("the PUT's hedges: started %d, won %d more, suppressed as body_pending %d; want 1, none and 0", started.Load(), len(won), pending.Load())
	}
	for _, n := range []string{"1", "2"} {
		if !bytes.Equal(bodies[n], payload) {
			t.Errorf("attempt %s's handler received %d bytes, want the %d of the body, byte for byte", n, len(bodies[n]), len(payload))
		}
	}
}
