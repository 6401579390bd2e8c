package httptestutil

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// Tracker is an [http.RoundTripper] that counts the requests passing
// through it, the responses it hands out and how many of their bodies were
// closed, so a test can assert that a client closes every body
// (Open() == 0). Wrap any RoundTripper, loopback or in-memory, with [Track].
// It does not modify requests; it replaces each response's Body with a
// counting wrapper, which keeps the io.Writer of a 101 Switching Protocols
// body. It is safe for concurrent use.
//
// A client may leave round trips running after its own call returned: a
// hedge leg that lost, or an attempt abandoned over a base that ignores
// cancellation. [Tracker.Wait] waits for them, so that a test counts what
// they handed out, and ends with none of them still running.
type Tracker struct {
	next http.RoundTripper

	requests  atomic.Int64
	errors    atomic.Int64
	responses atomic.Int64
	closed    atomic.Int64

	mu       sync.Mutex
	byMethod map[string]int64
	inFlight int64
	idle     sync.Cond // on mu; broadcast when inFlight drops to 0
}

// Track returns a Tracker that sends requests through rt. If rt is nil,
// [http.DefaultTransport] is used.
func Track(rt http.RoundTripper) *Tracker {
	if rt == nil {
		rt = http.DefaultTransport
	}
	t := &Tracker{next: rt, byMethod: make(map[string]int64)}
	t.idle.L = &t.mu
	return t
}

// RoundTrip counts req, sends it through the wrapped RoundTripper and, on
// success, wraps the response body to count its closing.
func (t *Tracker) RoundTrip(req *http.Request) (*http.Response, error) {
	t.requests.Add(1)
	m := req.Method
	if m == "" {
		m = http.MethodGet
	}
	t.mu.Lock()
	t.byMethod[m]++
	t.inFlight++
	t.mu.Unlock()
	defer t.done() // after the counting below, so Wait sees the counts final

	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.errors.Add(1)
		return resp, err
	}
	t.responses.Add(1)
	rc := resp.Body
	if rc == nil {
		rc = http.NoBody
	}
	if w, ok := rc.(io.Writer); ok {
		resp.Body = &trackedRWBody{trackedBody: trackedBody{rc: rc, t: t}, w: w}
	} else {
		resp.Body = &trackedBody{rc: rc, t: t}
	}
	return resp, nil
}

// done ends a round trip.
func (t *Tracker) done() {
	t.mu.Lock()
	t.inFlight--
	if t.inFlight == 0 {
		t.idle.Broadcast()
	}
	t.mu.Unlock()
}

// Wait blocks until no round trip is in flight through t: every RoundTrip
// call that has begun has returned, its response or error counted. Inside a
// [testing/synctest] bubble the wait is durable, so virtual time advances
// while it lasts: at the end of a test, call Wait (and then
// [testing/synctest.Wait], for the goroutines that close what those round
// trips returned) before asserting on the counts. It does not wait for bodies to
// be closed; that is what Open reports.
func (t *Tracker) Wait() {
	t.mu.Lock()
	for t.inFlight > 0 {
		t.idle.Wait()
	}
	t.mu.Unlock()
}

// InFlight returns the number of RoundTrip calls that have begun and not
// returned.
func (t *Tracker) InFlight() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// CloseIdleConnections calls CloseIdleConnections on the wrapped
// RoundTripper, if it has that method.
func (t *Tracker) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Requests returns the number of calls to RoundTrip.
func (t *Tracker) Requests() int64 { return t.requests.Load() }

// ByMethod returns the number of calls to RoundTrip by request method. The
// map is a copy.
func (t *Tracker) ByMethod() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[string]int64, len(t.byMethod))
	for k, v := range t.byMethod {
		m[k] = v
	}
	return m
}

// Errors returns the number of round trips that returned an error.
func (t *Tracker) Errors() int64 { return t.errors.Load() }

// Responses returns the number of responses handed out.
func (t *Tracker) Responses() int64 { return t.responses.Load() }

// BodiesClosed returns the number of response bodies closed. A body counts
// once however often it is closed; reading it to EOF does not count.
func (t *Tracker) BodiesClosed() int64 { return t.closed.Load() }

// Open returns the number of responses handed out whose bodies have not
// been closed yet.
func (t *Tracker) Open() int64 {
	// Load closed first: a body is closed only after its response was
	// counted, so the result is never negative.
	c := t.closed.Load()
	return t.responses.Load() - c
}

type trackedBody struct {
	rc     io.ReadCloser
	t      *Tracker
	closed atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) { return b.rc.Read(p) }

func (b *trackedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.t.closed.Add(1)
	}
	return b.rc.Close()
}

type trackedRWBody struct {
	trackedBody
	w io.Writer
}

func (b *trackedRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }
