package transport

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/resilix/resilix/policy"
)

// errCallersDisk is the read error of a caller's body.
var errCallersDisk = errors.New("caller's disk failed")

// failingBody is a caller's body that fails after its first bytes.
type failingBody struct{ sent bool }

func (b *failingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "par"), nil
	}
	return 0, errCallersDisk
}

func (b *failingBody) Close() error { return nil }

// callersBugs are PUTs whose fault is the caller's: each is a PUT of url
// with a body that cannot be sent as the request says.
var callersBugs = []struct {
	name string
	put  func(t *testing.T, url string) *http.Request
	// answerable: the server has the whole request once ContentLength
	// bytes are in, and may answer before net/http finds the bytes over:
	// a Success, no evidence against the host either, and under a busy
	// scheduler every PUT may end so.
	answerable bool
}{
	{"drained body, no GetBody", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, nil)
		req.Body, req.ContentLength = io.NopCloser(strings.NewReader("")), 7
		return req
	}, false},
	{"a reused request, its body drained", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, bytes.NewReader([]byte("payload")))
		io.Copy(io.Discard, req.Body) // GetBody still gives the whole body
		return req
	}, false},
	{"a body longer than its ContentLength", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, strings.NewReader("payload"))
		req.ContentLength = 3
		return req
	}, false},
	{"a body longer than its ContentLength, no GetBody", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, nil)
		req.Body, req.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader("payload"))), 3
		return req
	}, true},
	{"a body that fails to read, no GetBody", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, nil)
		req.Body, req.ContentLength = &failingBody{}, 7
		return req
	}, false},
	{"a body that fails to read, with GetBody", func(t *testing.T, url string) *http.Request {
		req := newPut(t, url, nil)
		req.Body, req.ContentLength = &failingBody{}, 7
		req.GetBody = func() (io.ReadCloser, error) { return &failingBody{}, nil }
		return req
	}, false},
}

func newPut(t *testing.T, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestACallersBugNeverOpensAHealthyHostsBreaker: 40 PUTs to a host that
// answers 200, each with a body that cannot be sent as its request says
// (shorter than its ContentLength, or failing to read), through a Breaker
// and a Retry, with and without Replicas: each is sent once, comes back
// Invalid with net/http's error (or the body's own), opens no breaker and
// ejects no lane, and a good GET afterwards gets its 200.
func TestACallersBugNeverOpensAHealthyHostsBreaker(t *testing.T) {
	const calls = 40
	for _, bug := range callersBugs {
		for _, replicas := range []*policy.Replicas{nil, {}} {
			name := bug.name
			if replicas != nil {
				name += ", replicas"
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					f := newFleet()
					f.serve("api:80", "a", "b", "c", "d")
					var log callLog
					var opened, ejected atomic.Int64
					obs := log.observer()
					obs.BreakerTransition = func(b policy.BreakerTransition) {
						if b.To == policy.BreakerOpen {
							opened.Add(1)
						}
					}
					obs.LaneEjected = func(policy.LaneEjection) { ejected.Add(1) }
					rt := newLaneTransport(t, f, Config{
						Policies: policy.Set{Breaker: &policy.Breaker{}, Retry: &policy.Retry{}, Replicas: replicas},
						Observer: obs,
					})
					if replicas != nil {
						prime(t, rt, "http://api/")
					}
					log.reset()
					for i := range calls {
						resp, err := rt.RoundTrip(bug.put(t, "http://api/"))
						if resp != nil {
							// The server may answer before the body fails.
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						if errors.Is(err, policy.ErrRejected) {
							t.Fatalf("PUT %d: %v", i, err)
						}
					}
					synctest.Wait()
					log.mu.Lock()
					attempts, skips := log.attempts, log.skips
					log.mu.Unlock()
					invalid := 0
					for _, a := range attempts {
						if a.Attempt != 1 || a.Kind != policy.AttemptFirst {
							t.Fatalf("attempt %d (%v, %v, %v); want each PUT sent once", a.Attempt, a.Kind, a.Outcome, a.Err)
						}
						if a.Outcome == policy.Invalid {
							invalid++
						}
					}
					if len(attempts) != calls || invalid == 0 && !bug.answerable || len(skips) != 0 {
						t.Errorf("%d attempts, %d invalid, %d retries skipped; want %d attempts, invalid, none skipped",
							len(attempts), invalid, len(skips), calls)
					}
					if n := opened.Load(); n != 0 {
						t.Errorf("the breaker opened %d times", n)
					}
					if n := ejected.Load(); n != 0 {
						t.Errorf("%d lanes ejected", n)
					}
					if m := rt.Measured("api"); m.ErrorRate != 0 {
						t.Errorf("error rate %v; want 0", m.ErrorRate)
					}
					if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != http.StatusOK {
						t.Fatalf("a good GET after them: %d, %v", code, err)
					}
				})
			})
		}
	}
}
