package transport

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestContractUnderRandomFaults drives random policy sets against an
// upstream with random latencies and faults (503s with Retry-After, resets,
// slow headers, slow bodies), many calls at once, each with a deadline and
// a replayable body (through GetBody on half the calls, through the replay
// buffer on the others), and checks the RoundTripper contract on every
// call:
//
//   - exactly one of the response and the error is set;
//   - the call returns by its deadline (virtual time, exact);
//   - the caller's request is not modified, and its body is closed;
//   - every body the upstream receives is the caller's, byte for byte,
//     replayed or not;
//   - once the caller has closed what it got, every response body the
//     upstream handed out is closed: retries, hedge losers, all of them;
//   - nothing is left running (goleak, at the end of the package), and no
//     idle watchdog's timer (on seeds that set Timeout.Idle).
//
// Odd seeds put a stubborn RoundTripper under resilix, one that ignores
// cancellation and answers when it is done: hedge losers and timed-out
// attempts then come back with responses after resilix has moved on, and
// must still be closed. A base like that cannot be hurried, so the deadline
// is not checked there; net/http's transport honours cancellation.
func TestContractUnderRandomFaults(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { contractScenario(t, seed) })
		})
	}
}

func contractScenario(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	maybe := func() bool { return rng.IntN(2) == 0 }
	set := policy.Set{Attempts: 1 + rng.IntN(4)}
	if set.Attempts > 1 || maybe() {
		set.Retry = &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond}
	}
	if maybe() {
		set.Hedge = &policy.Hedge{Quantile: 0.5 + rng.Float64()*0.45, MaxConcurrent: 2 + rng.IntN(2), MinSamples: 5}
	}
	if set.Retry == nil && set.Hedge == nil {
		set.Attempts = 1
	}
	if set.Attempts == 1 { // nothing to retry or hedge, which Validate refuses
		set.Retry, set.Hedge = nil, nil
	}
	if set.Hedge != nil { // legs beyond Attempts never fly, which Validate refuses
		set.Hedge.MaxConcurrent = min(set.Hedge.MaxConcurrent, set.Attempts)
	}
	if maybe() {
		set.Timeout = &policy.Timeout{PerAttempt: time.Duration(20+rng.IntN(200)) * time.Millisecond}
	}
	if maybe() {
		set.Breaker = &policy.Breaker{OpenFor: 100 * time.Millisecond}
	}
	if maybe() {
		set.Throttler = &policy.Throttler{}
	}
	if maybe() {
		set.Limiter = &policy.Limiter{InitialLimit: 4}
	}
	if maybe() {
		set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 1 + rng.IntN(8), MaxWait: time.Duration(rng.IntN(100)) * time.Millisecond}
	}
	if maybe() {
		set.RateLimit = &policy.RateLimit{PerSecond: 50 + float64(rng.IntN(500)), MaxWait: time.Duration(rng.IntN(50)) * time.Millisecond}
	}
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Bimodal(time.Duration(1+rng.IntN(10))*time.Millisecond, time.Duration(50+rng.IntN(500))*time.Millisecond, 0.1),
		Faults: []httptestutil.Fault{
			{Probability: 0.1 * rng.Float64(), Status: 503, RetryAfter: "0"},
			{Probability: 0.05 * rng.Float64(), Reset: true},
			{Probability: 0.05 * rng.Float64(), SlowHeaders: 300 * time.Millisecond, Status: 200},
			{Probability: 0.05 * rng.Float64(), SlowBody: 20 * time.Millisecond, Status: 200},
		},
		Seed:     seed,
		BodySize: 64,
		Capacity: 16,
	})
	if maybe() {
		if set.Timeout == nil {
			set.Timeout = &policy.Timeout{}
		}
		set.Timeout.Idle = time.Duration(10+rng.IntN(100)) * time.Millisecond
	}
	set.ReplayBuffer = []int{0, 8, 32}[rng.IntN(3)]
	checker := &bodyCheck{next: up.RoundTripper()}
	var base http.RoundTripper = checker
	stubborn := seed%2 == 1
	if stubborn {
		inner := base
		base = fakeRT(func(r *http.Request) (*http.Response, error) {
			return inner.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
		})
	}
	tracker := httptestutil.Track(base)
	tr := mustNew(t, Config{Base: tracker, Policies: set})

	var (
		wg     sync.WaitGroup
		failed atomic.Int32
		mu     sync.Mutex
		bodies []*trackedReq
	)
	for w := range 8 {
		wg.Go(func() {
			for i := range 40 {
				if failed.Load() > 0 {
					return
				}
				body, err := contractCall(tr, w, i, !stubborn)
				mu.Lock()
				bodies = append(bodies, body)
				mu.Unlock()
				if err != nil {
					failed.Add(1)
					t.Errorf("%+v: %v", set, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Legs may outlive their calls. Cancelled ones wind down at once, but
	// over the stubborn base a hedge loser runs until the upstream answers,
	// later in virtual time. synctest.Wait does not advance the clock: it
	// would return with such a leg asleep in the upstream, and the bubble
	// would end with it blocked. Whether one is left depends on which legs
	// drew the slow latencies, that is on the order in which runnable
	// goroutines reached the upstream, which synctest does not fix. So
	// wait for every round trip to return, then for the goroutines that
	// close what they returned.
	tracker.Wait()
	synctest.Wait()
	if open := tracker.Open(); open != 0 {
		t.Errorf("%+v: %d response bodies handed out by the upstream are still open", set, open)
	}
	for i, b := range bodies {
		if !b.closed.Load() {
			t.Errorf("%+v: request body %d was never closed", set, i)
			break
		}
	}
	for _, w := range checker.wrongs() {
		t.Errorf("%+v: %s", set, w)
	}
	if n := tr.watchdogs.Load(); n != 0 {
		t.Errorf("%+v: %d idle watchdogs left after every call", set, n)
	}
}

// bodyCheck is a base that reads each request's body and records it when
// it is not the payload the request's X-Payload header holds, then passes
// the request on with the body it read.
type bodyCheck struct {
	next  http.RoundTripper
	mu    sync.Mutex
	wrong []string
}

func (b *bodyCheck) RoundTrip(r *http.Request) (*http.Response, error) {
	got, err := io.ReadAll(r.Body)
	r.Body.Close()
	if want := r.Header.Get("X-Payload"); err != nil || string(got) != want {
		b.mu.Lock()
		b.wrong = append(b.wrong, fmt.Sprintf("the upstream received %q, %v; want %q", got, err, want))
		b.mu.Unlock()
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(strings.NewReader(string(got)))
	return b.next.RoundTrip(r2)
}

func (b *bodyCheck) wrongs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.wrong
}

// trackedReq is a request body that records its Close.
type trackedReq struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedReq) Close() error { b.closed.Store(true); return nil }

// contractCall makes one call and checks the contract on it. It returns
// the request body, to be checked closed once everything has settled.
func contractCall(tr *Transport, w, i int, checkDeadline bool) (*trackedReq, error) {
	deadline := time.Duration(50+(w*40+i)%400) * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if i%3 == 0 {
		ctx = shedding.WithPriority(ctx, shedding.Priority(i%4))
	}
	// A body of its own, 0 to 40 bytes; half the calls' bodies have no
	// GetBody, so that only the replay buffer can send them again.
	payload := strings.Repeat(fmt.Sprintf("[%d.%d]", w, i), 10)[:(w*13+i*7)%41]
	body := &trackedReq{Reader: strings.NewReader(payload)}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://up.test/", body)
	req.GetBody = nil
	if i%2 == 0 {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(payload)), nil }
	}
	req.Header.Set("X-Payload", payload)
	before := *req
	start := time.Now()

	resp, err := tr.RoundTrip(req)

	switch {
	case (resp == nil) == (err == nil):
		return body, fmt.Errorf("RoundTrip returned %v and %v", resp, err)
	case checkDeadline && time.Since(start) > deadline:
		return body, fmt.Errorf("returned after %v, past its %v deadline", time.Since(start), deadline)
	case req.Body != before.Body || req.Context() != before.Context() || req.URL != before.URL:
		return body, fmt.Errorf("the caller's request was modified")
	}
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return body, nil
}
