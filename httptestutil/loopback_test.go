package httptestutil_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// loopback serves u on a real loopback socket and returns a tracked client
// with its own transport; both are shut down when the test ends.
func loopback(t *testing.T, u *httptestutil.Upstream) (string, *httptestutil.Tracker) {
	t.Helper()
	srv := httptest.NewServer(u)
	tr := httptestutil.Track(&http.Transport{DisableKeepAlives: true})
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	return srv.URL, tr
}

func TestLoopbackRetryAfter(t *testing.T) {
	u := httptestutil.NewUpstream(httptestutil.Options{
		Faults: []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable, RetryAfter: "5"}},
	})
	url, tr := loopback(t, u)
	resp, err := (&http.Client{Transport: tr}).Get(url + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "5" || body != "ok" {
		t.Errorf("status %d, Retry-After %q, body %q; want 503, 5, ok", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if tr.Open() != 0 || tr.Responses() != 1 {
		t.Errorf("Tracker: Open %d, Responses %d; want 0, 1", tr.Open(), tr.Responses())
	}
}

func TestLoopbackReset(t *testing.T) {
	u := httptestutil.NewUpstream(httptestutil.Options{
		Faults: []httptestutil.Fault{{Probability: 1, Reset: true}},
	})
	url, tr := loopback(t, u)
	resp, err := (&http.Client{Transport: tr}).Post(url, "text/plain", nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want a connection error", resp.StatusCode)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("err = %v, want ECONNRESET", err)
	}
	if tr.Errors() != 1 {
		t.Errorf("Tracker.Errors = %d, want 1", tr.Errors())
	}
}

func TestLoopbackSlowBodyAndTracker(t *testing.T) {
	u := httptestutil.NewUpstream(httptestutil.Options{
		BodySize: 9,
		Chunks:   3,
		Faults:   []httptestutil.Fault{{Probability: 1, SlowBody: time.Millisecond}},
	})
	url, tr := loopback(t, u)
	client := &http.Client{Transport: tr}
	var leaked []*http.Response
	for i := range 3 {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			leaked = append(leaked, resp)
			continue
		}
		if body := readBody(t, resp); body != "ok\nok\nok\n" {
			t.Errorf("body %q, want the whole body", body)
		}
	}
	if tr.Responses() != 3 || tr.BodiesClosed() != 2 || tr.Open() != 1 {
		t.Errorf("Responses %d, BodiesClosed %d, Open %d; want 3, 2, 1", tr.Responses(), tr.BodiesClosed(), tr.Open())
	}
	for _, resp := range leaked {
		resp.Body.Close()
	}
	if tr.Open() != 0 {
		t.Errorf("Open = %d, want 0", tr.Open())
	}
}

func TestLoopbackCancel(t *testing.T) {
	u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Minute)})
	srv := httptest.NewServer(u)
	tr := &http.Transport{DisableKeepAlives: true}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	tr.CloseIdleConnections()
	srv.Close() // waits for the handler, which must notice the disconnect
	if st := u.Stats(); st.InFlight != 0 || st.Canceled != 1 {
		t.Errorf("InFlight %d, Canceled %d; want 0, 1", st.InFlight, st.Canceled)
	}
}
