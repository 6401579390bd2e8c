package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// halfThenStall is a handler that sends the first half of its body and
// then stalls until the request's context ends, which it records.
type halfThenStall struct {
	calls     atomic.Int32
	cancelled chan struct{}
}

func newHalfThenStall() *halfThenStall { return &halfThenStall{cancelled: make(chan struct{}, 16)} }

func (h *halfThenStall) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	w.Header().Set("Content-Length", "8")
	io.WriteString(w, "half")
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
	h.cancelled <- struct{}{}
}

// readUntilError reads body in small reads and returns what it read,
// when the first error came, and the error.
func readUntilError(body io.Reader) (string, time.Time, error) {
	var got strings.Builder
	p := make([]byte, 3)
	for {
		n, err := body.Read(p)
		got.Write(p[:n])
		if err != nil {
			return got.String(), time.Now(), err
		}
	}
}

// checkIdleError checks err is an idle timeout as a caller sees it.
func checkIdleError(t *testing.T, err error) {
	t.Helper()
	var ne net.Error
	if !errors.Is(err, policy.ErrAttemptTimeout) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err %v; want an attempt timeout whose Timeout() is true", err)
	}
	if !strings.Contains(err.Error(), "no response body bytes for") {
		t.Fatalf("err %q does not say what timed out", err)
	}
}

// TestIdleCutsAStalledBody: a body that stalls after its first half fails,
// once a Read has waited Idle (and no more than a quarter more), with an
// attempt timeout; the attempt's context is cancelled and its bulkhead slot
// released at once, and the call is not retried, since the caller already
// has part of the body.
func TestIdleCutsAStalledBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHalfThenStall()
		set := retrySet()
		set.Timeout = &policy.Timeout{Idle: time.Second}
		set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 1}
		tr := mustNew(t, Config{Base: httptestutil.InMemory(h), Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		start := time.Now()
		got, at, err := readUntilError(resp.Body)
		if got != "half" {
			t.Fatalf("read %q before the error, want the half sent", got)
		}
		checkIdleError(t, err)
		if waited := at.Sub(start); waited < time.Second || waited > 1250*time.Millisecond {
			t.Fatalf("the read failed after %v; want between Idle and Idle×1.25", waited)
		}
		<-h.cancelled // the attempt's context ended: the exchange is released
		if n := tr.Measured("a.test").BulkheadInFlight; n != 0 {
			t.Fatalf("%d bulkhead slots held after the idle timeout, want 0", n)
		}
		if n := h.calls.Load(); n != 1 {
			t.Fatalf("%d wire calls; a body partly handed to the caller is never retried", n)
		}
		if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, policy.ErrAttemptTimeout) && !errors.Is(err, context.Canceled) {
			t.Fatalf("a read after the timeout: %v", err)
		}
	})
}

// TestIdleSparesASteadyStream: a body that comes slowly but steadily, a
// byte every half Idle for five Idles, is never cut; nor is one the caller
// leaves unread for longer than Idle: only a Read that waits counts.
func TestIdleSparesASteadyStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Second
		steady := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			for i := range 10 {
				if i > 0 {
					time.Sleep(idle / 2)
				}
				io.WriteString(w, "x")
				rc.Flush()
			}
		})
		set := policy.Set{Timeout: &policy.Timeout{Idle: idle}}
		tr := mustNew(t, Config{Base: httptestutil.InMemory(steady), Policies: set})
		resp, err := get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "xxxxxxxxxx" {
			t.Fatalf("read %q, %v; want the whole steady body", b, err)
		}

		whole := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "all of it") })
		tr = mustNew(t, Config{Base: httptestutil.InMemory(whole), Policies: set})
		resp, err = get(t, t.Context(), tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * idle) // the caller is busy; nothing waits
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "all of it" {
			t.Fatalf("read %q, %v after a pause; want the body", b, err)
		}
	})
}

// TestIdleWatchdogEndsWithTheBody: the one timer that watches a body stops
// when the body is closed, read to its end, or fails, and never starts
// again; the transport holds no watchdog once every body is done with.
func TestIdleWatchdogEndsWithTheBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHalfThenStall()
		whole := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
		set := policy.Set{Timeout: &policy.Timeout{Idle: time.Second}}
		for _, tc := range []struct {
			name string
			base http.Handler
			use  func(io.ReadCloser)
		}{
			{"closed unread", whole, func(b io.ReadCloser) { b.Close() }},
			{"read to the end", whole, func(b io.ReadCloser) { io.ReadAll(b) }},
			{"timed out", h, func(b io.ReadCloser) { io.ReadAll(b); <-h.cancelled }},
		} {
			tr := mustNew(t, Config{Base: httptestutil.InMemory(tc.base), Policies: set})
			resp, err := get(t, t.Context(), tr, "http://a.test/")
			if err != nil {
				t.Fatal(err)
			}
			if n := tr.watchdogs.Load(); n != 1 {
				t.Fatalf("%s: %d watchdogs while the body is open, want 1", tc.name, n)
			}
			tc.use(resp.Body)
			if n := tr.watchdogs.Load(); n != 0 {
				t.Fatalf("%s: %d watchdogs left, want 0", tc.name, n)
			}
			w := resp.Body.(*releaser).idle
			time.Sleep(10 * time.Second)
			if w.timer.Stop() {
				t.Fatalf("%s: the watchdog's timer was armed again", tc.name)
			}
			resp.Body.Close()
		}
	})
}

// TestLoopbackIdle: over real sockets and net/http's transport, a server
// that sends half a body and stalls is cut after Idle, the server sees the
// request's context end (the connection is released), and a slow but
// steady stream is not cut.
func TestLoopbackIdle(t *testing.T) {
	// Real time: the steady stream's gaps are a tenth of Idle, so that
	// only a scheduler stall of nine tenths of Idle could cut it.
	const idle = 250 * time.Millisecond
	base := cleanhttp.DefaultPooledTransport()
	defer base.CloseIdleConnections()
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{Timeout: &policy.Timeout{Idle: idle}}})
	c := &http.Client{Transport: tr}

	t.Run("stalled", func(t *testing.T) {
		h := newHalfThenStall()
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		start := time.Now()
		got, at, err := readUntilError(resp.Body)
		if got != "half" {
			t.Fatalf("read %q, want the half sent", got)
		}
		checkIdleError(t, err)
		if waited := at.Sub(start); waited < idle {
			t.Fatalf("cut after %v, before Idle", waited)
		}
		select {
		case <-h.cancelled:
		case <-time.After(10 * time.Second):
			t.Fatal("the server's request never ended: the connection was not released")
		}
	})
	t.Run("steady", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			for i := range 20 { // 2 Idles in all
				if i > 0 {
					time.Sleep(idle / 10)
				}
				io.WriteString(w, "x")
				rc.Flush()
			}
		}))
		defer srv.Close()
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != strings.Repeat("x", 20) {
			t.Fatalf("read %q, %v; want the whole steady body", b, err)
		}
	})
}

// TestIdleValidation: Idle must not be negative; zero is off.
func TestIdleValidation(t *testing.T) {
	_, err := New(Config{Policies: policy.Set{Timeout: &policy.Timeout{Idle: -time.Second}}})
	if err == nil || !strings.Contains(err.Error(), "policy: Timeout.Idle must be >= 0") {
		t.Fatalf("New: %v; want Timeout.Idle named", err)
	}
	if _, err := New(Config{Policies: policy.Set{Timeout: &policy.Timeout{}}}); err != nil {
		t.Fatal(err)
	}
}
