package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestSoak runs the adversary's contract checks over real loopback
// sockets and net/http's transport, for RESILIX_SOAK (a Go duration; `make
// soak` sets it to minutes). Without it, it runs a short version, which
// `make test` includes.
//
// Three upstreams, fewer keys than hosts, 16 callers with deadlines from
// 50 to 500 ms, and a weather that changes every quarter second: calm,
// a 5xx storm, resets, stalled bodies, slow headers; the base panics now
// and then (the callers recover). Half the callers' bodies have no
// GetBody, so that net/http's write loop reads them through the replay
// buffer, and response bodies that stall are cut by Timeout.Idle. It
// checks every call's contract as it comes back (one of response and
// error; back by its deadline, with a margin for a loaded machine, since
// real sockets run on real time), every request body a server read whole
// against what its caller sent, byte for byte, and at the end that every
// response body is closed, every request body was closed, every permit is
// back, no idle watchdog and no goroutine is left. It prints what it
// checked.
//
// It runs twice: over one pool, and with Replicas (three connection lanes
// a key), whose lanes are clones of the base, so that nothing can stand
// between them and net/http: that run has no panicking base, and it counts
// connections instead of bodies. A response body left open keeps its
// connection busy, so once every lane's idle connections are closed, a
// connection still open is a body resilix (or the caller) did not close.
func TestSoak(t *testing.T) {
	d := 2 * time.Second
	if v := os.Getenv("RESILIX_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("RESILIX_SOAK=%q: %v", v, err)
		}
	} else if testing.Short() {
		d = 500 * time.Millisecond
	}
	for _, lanes := range []bool{false, true} {
		t.Run(fmt.Sprintf("replicas=%v", lanes), func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			s := newSoak(t, 3, lanes)
			s.run(t, d)
			s.check(t)
		})
	}
}

// soakSlack is how far past its deadline a call may return over loopback
// before it counts as late: scheduling on a loaded 2-core machine, not
// resilix, decides the last hundreds of milliseconds (up to 441 ms seen
// beside a CPU hog under -race). A call held by a stalled body (5 s) or a
// base past its deadline would still be caught.
const soakSlack = 2 * time.Second

type soak struct {
	ups     []*httptestutil.Upstream
	urls    []string
	closers []func()
	base    *http.Transport
	tracker *httptestutil.Tracker // nil with lanes
	conns   atomic.Int64          // connections the base dialed and has not closed
	wire    atomic.Int64          // wire attempts
	tr      *Transport
	set     policy.Set

	calls, ok, failed, refused, canceled, panics atomic.Int64
	late                                         atomic.Int64
	bodiesChecked                                atomic.Int64
	wrongBodies                                  atomic.Int64
	worstLate                                    atomic.Int64 // ns past the deadline
	reqBodies                                    sync.Map     // *trackedReq → struct{}
	byGate                                       [8]atomic.Int64
}

func newSoak(t *testing.T, hosts int, lanes bool) *soak {
	s := &soak{}
	for i := range hosts {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Latency:  httptestutil.Bimodal(time.Millisecond, 80*time.Millisecond, 0.05),
			Seed:     uint64(i),
			BodySize: 512,
		})
		srv := httptest.NewServer(s.checkBodies(u))
		s.ups = append(s.ups, u)
		s.urls = append(s.urls, srv.URL)
		s.closers = append(s.closers, srv.Close)
	}
	s.base = cleanhttp.DefaultPooledTransport()
	dial := s.base.DialContext
	s.base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		s.conns.Add(1)
		return &countedConn{Conn: c, open: &s.conns}, nil
	}
	var base http.RoundTripper = s.base
	if !lanes {
		s.tracker = httptestutil.Track(panicky{s.base, &s.panics})
		base = s.tracker
	}
	s.set = policy.Set{
		Attempts: 4,
		Retry:    &policy.Retry{BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Hedge:    &policy.Hedge{Quantile: 0.9, MaxConcurrent: 3, MinSamples: 10},
		Timeout:  &policy.Timeout{PerAttempt: 200 * time.Millisecond, Idle: 100 * time.Millisecond},
		Breaker:  &policy.Breaker{OpenFor: 200 * time.Millisecond},
		Limiter:  &policy.Limiter{},
		Bulkhead: &policy.Bulkhead{MaxConcurrent: 8, MaxWait: 20 * time.Millisecond},
		Budget:   policy.Budget{Ratio: 0.2},
	}
	if lanes {
		s.set.Replicas = &policy.Replicas{Connections: 3}
	}
	s.tr = mustNew(t, Config{Base: base, Policies: s.set, MaxKeys: hosts, Observer: &policy.Observer{
		Refused:     func(r policy.Refusal) { s.byGate[int(r.Gate)%len(s.byGate)].Add(1) },
		AttemptDone: func(policy.AttemptInfo) { s.wire.Add(1) },
	}})
	return s
}

// countedConn is a connection that counts itself out of open when closed,
// once.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// panicky is a base that panics on about 0.5% of calls, before sending.
type panicky struct {
	rt     http.RoundTripper
	panics *atomic.Int64
}

func (p panicky) RoundTrip(r *http.Request) (*http.Response, error) {
	if rand.IntN(200) == 0 {
		if r.Body != nil {
			r.Body.Close()
		}
		p.panics.Add(1)
		panic("soak: base bug")
	}
	return p.rt.RoundTrip(r)
}

// weather is the faults of one quarter second.
var weather = [][]httptestutil.Fault{
	nil, // calm
	{{Probability: 0.6, Status: 503, RetryAfter: "0"}},                             // a 5xx storm
	{{Probability: 0.2, Reset: true}},                                              // resets
	{{Probability: 0.1, Status: 503, SlowBody: 5 * time.Second}},                   // stalled bodies
	{{Probability: 0.1, SlowHeaders: 300 * time.Millisecond}, {Probability: 0.05}}, // slow headers
}

func (s *soak) run(t *testing.T, d time.Duration) {
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; time.Now().Before(stop); i++ {
			for _, u := range s.ups {
				u.SetFaults(weather[(i+rand.IntN(2))%len(weather)]...)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for time.Now().Before(stop) {
				refused, err := s.call(rng)
				if err != nil {
					t.Error(err)
					return
				}
				if refused {
					time.Sleep(5 * time.Millisecond) // a caller backs off a refusal
				}
			}
		})
	}
	wg.Wait()
}

// checkBodies reads each request's body and, when it arrived whole,
// counts it wrong unless it is what the X-Payload header says, then serves
// the request with it.
func (s *soak) checkBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err == nil {
			s.bodiesChecked.Add(1)
			if string(b) != r.Header.Get("X-Payload") {
				s.wrongBodies.Add(1)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		next.ServeHTTP(w, r)
	})
}

func (s *soak) call(rng *rand.Rand) (refused bool, err error) {
	s.calls.Add(1)
	deadline := time.Duration(50+rng.IntN(450)) * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	ctx = shedding.WithPriority(ctx, shedding.Priority(rng.IntN(4)))
	method := []string{http.MethodGet, http.MethodPut, http.MethodPost}[rng.IntN(3)]
	payload := strings.Repeat("payload.", rng.IntN(2000)) // up to 16 KB; a header value keeps no trailing space
	body := &trackedReq{Reader: strings.NewReader(payload)}
	s.reqBodies.Store(body, struct{}{})
	req, _ := http.NewRequestWithContext(ctx, method, s.urls[rng.IntN(len(s.urls))], body)
	req.GetBody = nil // the replay buffer's
	if rng.IntN(2) == 0 {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(payload)), nil }
	}
	req.Header.Set("X-Call", "1")
	req.Header.Set("X-Payload", payload)
	start := time.Now()

	panicked := false
	resp, err := func() (*http.Response, error) {
		defer func() {
			if p := recover(); p != nil {
				if !strings.Contains(fmt.Sprint(p), "soak: base bug") {
					panic(p)
				}
				panicked = true
			}
		}()
		return s.tr.RoundTrip(req)
	}()
	took := time.Since(start)
	if panicked {
		return false, nil
	}
	if (resp == nil) == (err == nil) {
		return false, fmt.Errorf("RoundTrip returned %v and %v", resp, err)
	}
	if over := took - deadline; over > 0 {
		for {
			w := s.worstLate.Load()
			if int64(over) <= w || s.worstLate.CompareAndSwap(w, int64(over)) {
				break
			}
		}
		if over > soakSlack {
			s.late.Add(1)
		}
	}
	switch {
	case err == nil:
		if resp.StatusCode < 500 {
			s.ok.Add(1)
		} else {
			s.failed.Add(1)
		}
		if resp.StatusCode == 200 {
			// A slow body may outlive the deadline: the caller's
			// context ends the read.
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
	case errors.Is(err, policy.ErrRejected):
		s.refused.Add(1)
		refused = true
	case ctx.Err() != nil:
		s.canceled.Add(1)
	default:
		s.failed.Add(1)
	}
	req.Header.Set("X-Call", "reused") // as net/http allows once the body is closed
	return refused, nil
}

func (s *soak) check(t *testing.T) {
	// Background drains end within DrainTime; a stalled body's server
	// side within its SlowBody.
	time.Sleep(httpx.DrainTime)
	if s.tracker != nil {
		waitFor(2*time.Second, func() bool { return s.tracker.Open() == 0 })
		if open := s.tracker.Open(); open != 0 {
			t.Errorf("%d response bodies left open", open)
		}
	} else {
		// Every lane's idle connections closed: what is left open is
		// held by a body nobody closed.
		waitFor(2*time.Second, func() bool { s.tr.CloseIdleConnections(); return s.conns.Load() == 0 })
		if open := s.conns.Load(); open != 0 {
			t.Errorf("%d connections left open once every lane's idle ones were closed: a response body left open", open)
		}
	}
	unclosed := 0
	waitFor(2*time.Second, func() bool {
		unclosed = 0
		s.reqBodies.Range(func(k, _ any) bool {
			if !k.(*trackedReq).closed.Load() {
				unclosed++
			}
			return true
		})
		return unclosed == 0
	})
	if unclosed != 0 {
		t.Errorf("%d request bodies never closed", unclosed)
	}
	for _, u := range s.urls {
		m := s.tr.Measured(strings.TrimPrefix(u, "http://"))
		if m.BulkheadInFlight != 0 || m.LimiterInFlight != 0 || m.LimiterQueued != 0 {
			t.Errorf("%s holds bulkhead %d, limiter %d+%d queued after every call", u, m.BulkheadInFlight, m.LimiterInFlight, m.LimiterQueued)
		}
	}
	if n := s.tr.watchdogs.Load(); n != 0 {
		t.Errorf("%d idle watchdogs left", n)
	}
	if n := s.wrongBodies.Load(); n != 0 {
		t.Errorf("%d of %d request bodies the servers read whole were not what their callers sent", n, s.bodiesChecked.Load())
	}
	if late := s.late.Load(); late > 0 {
		t.Errorf("%d calls returned more than %v past their deadline (worst %v)", late, soakSlack, time.Duration(s.worstLate.Load()))
	}
	s.base.CloseIdleConnections()
	for _, c := range s.closers {
		c()
	}
	var gates []string
	for g := range s.byGate {
		if n := s.byGate[g].Load(); n > 0 {
			gates = append(gates, fmt.Sprintf("%v %d", policy.Gate(g), n))
		}
	}
	t.Logf("soak: %d calls (%d ok, %d failed, %d refused, %d ended by their deadline, %d base panics recovered), %d wire attempts, refusals by gate (attempts) %v; "+
		"checked: one of response and error, back by the deadline (worst %v over, slack %v), "+
		"%d request bodies byte for byte, every response and request body closed, every permit back, no watchdog or goroutine left",
		s.calls.Load(), s.ok.Load(), s.failed.Load(), s.refused.Load(), s.canceled.Load(), s.panics.Load(), s.wire.Load(), gates,
		time.Duration(s.worstLate.Load()), soakSlack, s.bodiesChecked.Load())
}

// waitFor polls cond for up to d: real sockets settle on real time.
func waitFor(d time.Duration, cond func() bool) {
	for end := time.Now().Add(d); !cond() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
}
