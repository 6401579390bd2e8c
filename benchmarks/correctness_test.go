package benchmarks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// The correctness tests put each library in a situation where the
// RoundTripper contract or the safety of a repeated request is at stake.
// Each test asserts what resilix does and logs what the peers do, without
// failing on a peer's behaviour: run them with go test -v to read the
// facts. They run in synctest bubbles over an in-process base, so the
// latencies are exact and no wall-clock time passes.

const payload = "payload"

// scriptedBase is an in-process base RoundTripper. It reads and closes the
// request body, as a real transport does, and keeps what it read; it
// answers status after a latency chosen by the script. It counts the
// CloseIdleConnections calls that reach it.
type scriptedBase struct {
	status int

	mu     sync.Mutex
	n      int
	script func(n int) (d time.Duration, ignoreCancel bool) // nil: at once
	bodies []string

	idleClosed atomic.Int64
}

func (s *scriptedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	s.n++
	s.bodies = append(s.bodies, string(body))
	var (
		d            time.Duration
		ignoreCancel bool
	)
	if s.script != nil {
		d, ignoreCancel = s.script(s.n)
	}
	s.mu.Unlock()
	if d > 0 {
		if ignoreCancel {
			// The response crosses the cancellation: its headers were on
			// their way when the caller gave up, as happens on a real
			// network.
			time.Sleep(d)
		} else {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		}
	}
	return &http.Response{
		StatusCode: s.status,
		Status:     http.StatusText(s.status),
		Header:     http.Header{},
		Body:       io.NopCloser(strings.NewReader("body")),
		Request:    r,
	}, nil
}

func (s *scriptedBase) CloseIdleConnections() { s.idleClosed.Add(1) }

func (s *scriptedBase) setScript(f func(n int) (time.Duration, bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n = 0
	s.script = f
}

// slowFirst makes the next arrival take slow (ignoring cancellation when
// ignoreCancel) and every later one 1ms.
func (s *scriptedBase) slowFirst(slow time.Duration, ignoreCancel bool) {
	s.setScript(func(n int) (time.Duration, bool) {
		if n == 1 {
			return slow, ignoreCancel
		}
		return time.Millisecond, false
	})
}

func newRequest(t *testing.T, ctx context.Context, method string) *http.Request {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost || method == http.MethodPut {
		body = strings.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://a.test/", body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// call sends one request through rt as http.Client would use it: a
// response that comes with an error is not the caller's to close. It
// reports the status (0 without a response) and whether the RoundTripper
// broke the contract by returning a response and an error together.
func call(t *testing.T, rt http.RoundTripper, method string) (status int, both bool, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := rt.RoundTrip(newRequest(t, ctx, method))
	if resp != nil {
		status = resp.StatusCode
	}
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return status, resp != nil && err != nil, err
}

// learn teaches rt a calm latency of 10ms with 30 GETs.
func learn(t *testing.T, rt http.RoundTripper, base *scriptedBase) {
	t.Helper()
	base.setScript(func(int) (time.Duration, bool) { return 10 * time.Millisecond, false })
	for range 30 {
		if _, _, err := call(t, rt, http.MethodGet); err != nil {
			t.Fatal(err)
		}
	}
}

// settle lets every leg still running finish and every goroutine of the
// bubble come to rest.
func settle() {
	time.Sleep(time.Second)
	synctest.Wait()
}

// TestPlainPOSTNotRepeated: a plain POST (no idempotency key) is not safe
// to send twice. Each library gets a GET and then a POST against an
// upstream that always answers 503 (retry) or whose first leg is slow
// (hedge); the test counts the arrivals of each at the base.
func TestPlainPOSTNotRepeated(t *testing.T) {
	arrivals := func(t *testing.T, tr *httptestutil.Tracker, rt http.RoundTripper, base *scriptedBase, prime func()) (get, post int64) {
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			prime()
			before := tr.ByMethod()[m]
			if _, _, err := call(t, rt, m); err != nil {
				t.Logf("%s: error %v", m, err)
			}
			settle()
			if m == http.MethodGet {
				get = tr.ByMethod()[m] - before
			} else {
				post = tr.ByMethod()[m] - before
			}
		}
		return get, post
	}
	t.Run("retry", func(t *testing.T) {
		for _, r := range retriers {
			t.Run(r.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &scriptedBase{status: http.StatusServiceUnavailable}
					tr := httptestutil.Track(base)
					rt := r.new(t, tr)
					get, post := arrivals(t, tr, rt, base, func() {})
					t.Logf("%s, upstream always 503: GET reached the wire %d times, plain POST %d times", r.name, get, post)
					if r.name == "resilix" && (get != 3 || post != 1) {
						t.Errorf("resilix: GET sent %d times, POST %d times; want 3 and 1", get, post)
					}
				})
			})
		}
	})
	t.Run("hedge", func(t *testing.T) {
		for _, h := range hedgers {
			t.Run(h.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &scriptedBase{status: http.StatusOK}
					tr := httptestutil.Track(base)
					rt := h.new(t, tr, 20*time.Millisecond) // a fixed delay, where there is one, of 20ms
					learn(t, rt, base)
					get, post := arrivals(t, tr, rt, base, func() { base.slowFirst(100*time.Millisecond, false) })
					t.Logf("%s, calm at 10ms, first leg 100ms: GET reached the wire %d times, plain POST %d times", h.name, get, post)
					if strings.HasPrefix(h.name, "resilix") && (get != 2 || post != 1) {
						t.Errorf("resilix: GET sent %d times, POST %d times; want 2 and 1", get, post)
					}
				})
			})
		}
	})
}

// TestDiscardedBodiesClosed: a response a library throws away (superseded
// by a retry, or a hedge's losing leg whose headers arrived as the winner
// was chosen) must be closed by the library, or its connection is never
// reused. The caller closes what it is handed, as http.Client does: not a
// response that comes with an error. Open() counts what nobody closed.
func TestDiscardedBodiesClosed(t *testing.T) {
	t.Run("retry", func(t *testing.T) {
		for _, r := range retriers {
			t.Run(r.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &scriptedBase{status: http.StatusServiceUnavailable}
					tr := httptestutil.Track(base)
					status, both, err := call(t, r.new(t, tr), http.MethodGet)
					settle()
					t.Logf("%s, upstream always 503: %d responses, %d left unclosed; caller got status %d, err %v, response and error together: %v",
						r.name, tr.Responses(), tr.Open(), status, err, both)
					if r.name == "resilix" && (tr.Open() != 0 || status != http.StatusServiceUnavailable || err != nil) {
						t.Errorf("resilix: %d bodies open, status %d, err %v; want 0, 503, nil", tr.Open(), status, err)
					}
				})
			})
		}
	})
	t.Run("hedge-loser", func(t *testing.T) {
		for _, h := range hedgers {
			t.Run(h.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &scriptedBase{status: http.StatusOK}
					tr := httptestutil.Track(base)
					rt := h.new(t, tr, 20*time.Millisecond)
					learn(t, rt, base)
					before := tr.Responses()
					base.slowFirst(100*time.Millisecond, true)
					if _, _, err := call(t, rt, http.MethodGet); err != nil {
						t.Fatal(err)
					}
					settle()
					t.Logf("%s, first leg 100ms (its response arrives after the hedge won): %d responses, %d left unclosed",
						h.name, tr.Responses()-before, tr.Open())
					if strings.HasPrefix(h.name, "resilix") && (tr.Open() != 0 || tr.Responses()-before != 2) {
						t.Errorf("resilix: %d responses, %d open; want 2, 0", tr.Responses()-before, tr.Open())
					}
				})
			})
		}
	})
}

// closeRecorder is a request body that records being closed.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// TestCallerRequestUnmodified: a RoundTripper must not modify the caller's
// request, must close its body, and must replay the body whole on every
// attempt. Each library retries a PUT with a body and a header against an
// upstream that always answers 503; the request is compared field by field
// before and after.
func TestCallerRequestUnmodified(t *testing.T) {
	for _, r := range retriers {
		t.Run(r.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptedBase{status: http.StatusServiceUnavailable}
				rt := r.new(t, base)
				type key struct{}
				ctx, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "caller"))
				defer cancel()
				req := newRequest(t, ctx, http.MethodPut)
				body := &closeRecorder{Reader: bytes.NewReader([]byte(payload))}
				req.Body = body // GetBody, from NewRequest, still replays the payload
				req.Header.Set("X-Caller", "1")

				before := *req
				header := req.Header.Clone()
				resp, err := rt.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
				settle()

				var diffs []string
				if req.Body != before.Body {
					diffs = append(diffs, "Body replaced")
				}
				if req.Context() != before.Context() {
					diffs = append(diffs, "context replaced")
				}
				if !maps.EqualFunc(req.Header, header, func(a, b []string) bool { return reflect.DeepEqual(a, b) }) {
					diffs = append(diffs, "Header changed")
				}
				if req.ContentLength != before.ContentLength || req.URL != before.URL || req.Method != before.Method {
					diffs = append(diffs, "ContentLength, URL or Method changed")
				}
				whole := 0
				for _, b := range base.bodies {
					if b == payload {
						whole++
					}
				}
				t.Logf("%s: %d attempts, %d carried the whole body; caller's body closed: %v; caller's request modified: %v",
					r.name, len(base.bodies), whole, body.closed.Load(), diffs)
				if r.name == "resilix" && (len(diffs) > 0 || !body.closed.Load() || whole != len(base.bodies) || whole != 3) {
					t.Errorf("resilix: modified %v, body closed %v, %d of %d attempts whole; want none, true, 3 of 3",
						diffs, body.closed.Load(), whole, len(base.bodies))
				}
			})
		})
	}
}

// TestCloseIdleConnections: http.Client.CloseIdleConnections reaches the
// transport through an interface assertion, so a wrapping RoundTripper
// must forward it. The test also counts the calls a library makes on its
// own during one call that runs out of retries.
func TestCloseIdleConnections(t *testing.T) {
	for _, r := range retriers {
		t.Run(r.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptedBase{status: http.StatusServiceUnavailable}
				rt := r.new(t, base)
				if _, _, err := call(t, rt, http.MethodGet); err != nil && !errors.Is(err, context.Canceled) {
					t.Logf("%s: the failing call returned %v", r.name, err)
				}
				bySelf := base.idleClosed.Load()
				(&http.Client{Transport: rt}).CloseIdleConnections()
				forwarded := base.idleClosed.Load() - bySelf
				t.Logf("%s: CloseIdleConnections forwarded to the base: %v; called on its own during one exhausted call: %d times",
					r.name, forwarded == 1, bySelf)
				if r.name == "resilix" && (forwarded != 1 || bySelf != 0) {
					t.Errorf("resilix: forwarded %d, on its own %d; want 1, 0", forwarded, bySelf)
				}
			})
		})
	}
}
