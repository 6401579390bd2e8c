package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestContractAgainstAnAdversary is TestContractUnderRandomFaults' sibling
// for the paths an attacker of the transport tries first: slow first legs
// while hedges fail at once, bodies that stall, a base that panics (the
// caller recovers, as net/http's server does), a caller that reuses its
// request the moment it has closed the body (-race is the judge), more
// hosts than MaxKeys, a base deaf to cancellation on odd seeds, attempts
// that never reach the server (a refused dial before the body is read, an
// HTTP/2 stream refused after half of it), bodies without GetBody of every
// size around a small replay buffer, and an idle bound on response bodies.
// Every call is checked as the contract test checks it, every body the
// base reads is checked byte for byte against what the caller sent, and at
// the end:
//
//   - no goroutine outlives the calls (the bubble refuses to end, naming
//     the goroutines left, if one does), and no idle watchdog's timer;
//   - no plain POST was processed more than once: it was re-sent only
//     after attempts that never reached the server;
//   - every response body the base handed out is closed;
//   - no host ever had more exchanges in flight than its bulkhead allows,
//     eviction or not;
//   - every bulkhead slot and limiter permit is back.
func TestContractAgainstAnAdversary(t *testing.T) {
	for seed := range uint64(16) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { adversaryScenario(t, seed, 6, 30) })
		})
	}
}

// adversarySet draws a policy set that amplifies, hedges and gates.
func adversarySet(rng *rand.Rand) policy.Set {
	maybe := func() bool { return rng.IntN(2) == 0 }
	set := policy.Set{
		Attempts: 2 + rng.IntN(7),
		Retry:    &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond},
		Hedge: &policy.Hedge{
			Quantile:      0.5 + rng.Float64()*0.4,
			MaxConcurrent: 2 + rng.IntN(3),
			MinSamples:    5,
		},
	}
	if set.Hedge.MaxConcurrent > set.Attempts {
		set.Hedge.MaxConcurrent = set.Attempts
	}
	if maybe() {
		set.Budget = policy.Budget{Ratio: -1}
	}
	if maybe() {
		set.Timeout = &policy.Timeout{PerAttempt: time.Duration(50+rng.IntN(300)) * time.Millisecond}
	}
	if maybe() {
		set.Breaker = &policy.Breaker{OpenFor: time.Duration(50+rng.IntN(500)) * time.Millisecond}
	}
	if maybe() {
		set.Limiter = &policy.Limiter{InitialLimit: 2 + rng.IntN(6)}
	}
	if maybe() {
		set.Throttler = &policy.Throttler{}
	}
	// The bulkhead is always on: it is the invariant eviction must keep.
	set.Bulkhead = &policy.Bulkhead{MaxConcurrent: 1 + rng.IntN(3), MaxWait: time.Duration(rng.IntN(50)) * time.Millisecond}
	// Replay buffers below, at and above the callers' body sizes (0 to
	// 80 bytes), or the default.
	set.ReplayBuffer = []int{0, 16, 40, 80}[rng.IntN(4)]
	if maybe() {
		if set.Timeout == nil {
			set.Timeout = &policy.Timeout{}
		}
		set.Timeout.Idle = time.Duration(20+rng.IntN(100)) * time.Millisecond
	}
	set.Propagate = maybe()
	return set
}

// describe says what a set has on, briefly.
func describe(s policy.Set) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Attempts %d", s.Attempts)
	if s.Budget.Ratio < 0 {
		b.WriteString(", no budget")
	}
	if s.Hedge != nil {
		fmt.Fprintf(&b, ", Hedge{q %.2f, MaxConcurrent %d}", s.Hedge.Quantile, s.Hedge.MaxConcurrent)
	}
	if s.Timeout != nil {
		fmt.Fprintf(&b, ", Timeout %v", s.Timeout.PerAttempt)
	}
	if s.Breaker != nil {
		b.WriteString(", Breaker")
	}
	if s.Limiter != nil {
		fmt.Fprintf(&b, ", Limiter{%d}", s.Limiter.InitialLimit)
	}
	if s.Throttler != nil {
		b.WriteString(", Throttler")
	}
	if s.Bulkhead != nil {
		fmt.Fprintf(&b, ", Bulkhead{%d, wait %v}", s.Bulkhead.MaxConcurrent, s.Bulkhead.MaxWait)
	}
	if s.ReplayBuffer != 0 {
		fmt.Fprintf(&b, ", ReplayBuffer %d", s.ReplayBuffer)
	}
	if s.Timeout != nil && s.Timeout.Idle > 0 {
		fmt.Fprintf(&b, ", Idle %v", s.Timeout.Idle)
	}
	if s.Propagate {
		b.WriteString(", Propagate")
	}
	return b.String()
}

// adversary is a base that misbehaves at random, and keeps count.
type adversary struct {
	rng      *rand.Rand
	mu       sync.Mutex
	deaf     bool // ignores cancellation
	inFlight map[string]int
	peak     map[string]int
	handed   atomic.Int64 // response bodies handed out
	closed   atomic.Int64 // and closed
	panics   atomic.Int64
	calls    atomic.Int64

	processed map[string]int // wire attempts per call that reached the "server"
	posts     map[string]bool
	wrong     []string // bodies that were not what the caller sent, and why
}

type move struct {
	latency time.Duration
	status  int
	stall   bool // the body never ends until closed
	panic   bool
	dial    bool // connection refused, before the body is read: unsent
	refused bool // HTTP/2 REFUSED_STREAM after half the body: unsent
	reset   bool // reset after the whole body: ambiguous
}

func (a *adversary) draw() move {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rng.Float64()
	m := move{latency: time.Millisecond + time.Duration(a.rng.IntN(4))*time.Millisecond, status: 200}
	switch {
	case r < 0.10: // a slow leg: hedged
		m.latency = time.Duration(100+a.rng.IntN(200)) * time.Millisecond
	case r < 0.35: // fails at once
		m.latency, m.status = 0, 503
	case r < 0.38:
		m.panic = true
	case r < 0.46:
		m.dial = true
	case r < 0.50:
		m.refused = true
	case r < 0.53:
		m.reset = true
	}
	if m.status != 200 && a.rng.IntN(2) == 0 {
		m.stall = true
	}
	return m
}

func (a *adversary) enter(host string) {
	a.mu.Lock()
	a.inFlight[host]++
	a.peak[host] = max(a.peak[host], a.inFlight[host])
	a.mu.Unlock()
}

func (a *adversary) leave(host string) {
	a.mu.Lock()
	a.inFlight[host]--
	a.mu.Unlock()
}

// errRefusedStream is net/http's error for an HTTP/2 stream the server
// refused, when the request's body has no GetBody.
var errRefusedStream = errors.New("http2: Transport: cannot retry err [stream error: stream ID 1; REFUSED_STREAM; received from peer] after Request.Body was written; define Request.GetBody to avoid this error")

// body reads n bytes of the request's body (all of it when n < 0), closes
// it, and records it if it is not the caller's payload, which the
// request's X-Payload header holds.
func (a *adversary) body(r *http.Request, n int) {
	if r.Body == nil {
		return
	}
	want := r.Header.Get("X-Payload")
	var got []byte
	var err error
	if n < 0 {
		got, err = io.ReadAll(r.Body)
	} else {
		got = make([]byte, min(n, len(want)))
		_, err = io.ReadFull(r.Body, got)
		want = want[:len(got)]
	}
	r.Body.Close()
	if err != nil || string(got) != want {
		a.mu.Lock()
		a.wrong = append(a.wrong, fmt.Sprintf("call %s: read %q, %v; want %q", r.Header.Get("X-Call"), got, err, want))
		a.mu.Unlock()
	}
}

// reached records an attempt that reached the server.
func (a *adversary) reached(r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := r.Header.Get("X-Call")
	a.processed[id]++
	if r.Method == http.MethodPost {
		a.posts[id] = true
	}
}

func (a *adversary) RoundTrip(r *http.Request) (*http.Response, error) {
	a.calls.Add(1)
	a.propagated(r)
	m := a.draw()
	switch {
	case m.dial:
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errRefused
	case m.refused:
		a.body(r, len(r.Header.Get("X-Payload"))/2)
		return nil, errRefusedStream
	}
	a.body(r, -1)
	a.reached(r)
	if m.reset {
		return nil, errReset
	}
	host := r.URL.Host
	a.enter(host)
	if m.panic {
		a.leave(host)
		a.panics.Add(1)
		panic("adversary: base bug")
	}
	if a.deaf {
		time.Sleep(m.latency)
	} else if !timing.Sleep(r.Context(), m.latency) {
		a.leave(host)
		return nil, r.Context().Err()
	}
	// What a base reads of its request after the wire call, as net/http's
	// write loop may: a leg must never be reading the caller's then.
	_ = r.Header.Get("X-Call")
	_ = r.URL.Path
	var b io.ReadCloser = io.NopCloser(strings.NewReader("ok"))
	if m.stall {
		b = newStallBody()
	}
	a.handed.Add(1)
	resp := &http.Response{StatusCode: m.status, Header: http.Header{}, Request: r,
		Body: &countedBody{ReadCloser: b, end: func() { a.leave(host) }, closed: func() { a.closed.Add(1) }}}
	return resp, nil
}

// propagated checks what a propagating key wrote: an attempt number, and
// never more time than the caller has left. The bubble's clock stands
// still between the header being written and the attempt reaching here.
func (a *adversary) propagated(r *http.Request) {
	n := r.Header.Get("Resilix-Attempt")
	v, has := r.Header["Resilix-Timeout-Ms"]
	if n == "" {
		if has {
			a.mu.Lock()
			a.wrong = append(a.wrong, fmt.Sprintf("call %s: a timeout header without an attempt number", r.Header.Get("X-Call")))
			a.mu.Unlock()
		}
		return
	}
	dl, _ := r.Context().Deadline() // every call has one
	ms, err := strconv.ParseInt(strings.Join(v, ","), 10, 64)
	if err != nil || time.Duration(ms)*time.Millisecond > max(time.Until(dl), 0) {
		a.mu.Lock()
		a.wrong = append(a.wrong, fmt.Sprintf("call %s, attempt %s: Resilix-Timeout-Ms %q with %v left",
			r.Header.Get("X-Call"), n, v, time.Until(dl)))
		a.mu.Unlock()
	}
}

// countedBody calls end once, at the exchange's end: EOF, a read error or
// Close, which is when resilix lets go of what the exchange holds; and
// closed once, at the first Close.
type countedBody struct {
	io.ReadCloser
	endOnce, closeOnce sync.Once
	end, closed        func()
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.endOnce.Do(b.end)
	}
	return n, err
}

func (b *countedBody) Close() error {
	err := b.ReadCloser.Close()
	b.endOnce.Do(b.end)
	b.closeOnce.Do(b.closed)
	return err
}

func adversaryScenario(t *testing.T, seed uint64, workers, calls int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	set := adversarySet(rng)
	hosts := 2 + rng.IntN(4)
	maxKeys := 1 + rng.IntN(hosts)
	base := &adversary{rng: rand.New(rand.NewPCG(seed, 8)), deaf: seed%2 == 1,
		inFlight: map[string]int{}, peak: map[string]int{}, processed: map[string]int{}, posts: map[string]bool{}}
	tr := mustNew(t, Config{Base: base, Policies: set, MaxKeys: maxKeys})
	desc := fmt.Sprintf("seed %d: %d hosts, MaxKeys %d, deaf %v, %s", seed, hosts, maxKeys, base.deaf, describe(set))

	var wg sync.WaitGroup
	var failed atomic.Bool
	var recovered atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				if failed.Load() {
					return
				}
				panicked, err := adversaryCall(tr, w, i, hosts, !base.deaf)
				if panicked {
					recovered.Add(1)
				}
				if err != nil {
					failed.Store(true)
					t.Errorf("%s: %v", desc, err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Let every deaf leg and background drain end (the slowest leg is
	// 300 ms; a drain is bounded by httpx.DrainTime).
	time.Sleep(time.Second + httpx.DrainTime)
	synctest.Wait()

	if open := base.handed.Load() - base.closed.Load(); open != 0 {
		t.Errorf("%s: %d response bodies left open", desc, open)
	}
	base.mu.Lock()
	for h, p := range base.peak {
		if p > set.Bulkhead.MaxConcurrent {
			t.Errorf("%s: host %s had %d exchanges in flight, bulkhead %d", desc, h, p, set.Bulkhead.MaxConcurrent)
		}
	}
	base.mu.Unlock()
	for h := range hosts {
		m := tr.Measured(fmt.Sprintf("h%d.test", h))
		if m.BulkheadInFlight != 0 || m.LimiterInFlight != 0 || m.LimiterQueued != 0 {
			t.Errorf("%s: h%d holds bulkhead %d, limiter %d+%d queued after every call", desc, h, m.BulkheadInFlight, m.LimiterInFlight, m.LimiterQueued)
		}
	}
	if base.panics.Load() != recovered.Load() {
		t.Errorf("%s: the base panicked %d times, callers recovered %d", desc, base.panics.Load(), recovered.Load())
	}
	if n := tr.watchdogs.Load(); n != 0 {
		t.Errorf("%s: %d idle watchdogs left after every call", desc, n)
	}
	base.mu.Lock()
	defer base.mu.Unlock()
	for _, w := range base.wrong {
		t.Errorf("%s: %s", desc, w)
	}
	for id := range base.posts {
		if n := base.processed[id]; n > 1 {
			t.Errorf("%s: POST %s reached the server %d times", desc, id, n)
		}
	}
}

// adversaryCall makes one call as a demanding caller would: a deadline, a
// random host, method and priority, a recover around RoundTrip, and the
// request reused as soon as its body is closed.
func adversaryCall(tr *Transport, w, i, hosts int, checkDeadline bool) (panicked bool, err error) {
	deadline := time.Duration(100+(w*37+i*11)%500) * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if i%4 == 0 {
		ctx = shedding.WithPriority(ctx, shedding.Priority(i%8/2))
	}
	method := []string{http.MethodGet, http.MethodPut, http.MethodPost}[(w+i)%3]
	// A body of 0 to 80 bytes, its own; every other call's has no
	// GetBody, so that only the replay buffer can send it twice.
	payload := strings.Repeat(fmt.Sprintf("<%d.%d>", w, i), 20)[:(w*31+i*17)%81]
	reqBody := &trackedReq{Reader: strings.NewReader(payload)}
	req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://h%d.test/", (w+i)%hosts), reqBody)
	req.GetBody = nil
	if i%2 == 0 {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(payload)), nil }
	}
	req.Header.Set("X-Call", fmt.Sprint(w, i))
	req.Header.Set("X-Payload", payload)
	start := time.Now()

	resp, rerr := func() (resp *http.Response, err error) {
		defer func() {
			if p := recover(); p != nil {
				if !strings.Contains(fmt.Sprint(p), "adversary: base bug") {
					panic(p)
				}
				panicked = true
			}
		}()
		return tr.RoundTrip(req)
	}()
	if panicked {
		return true, nil
	}
	switch {
	case (resp == nil) == (rerr == nil):
		return false, fmt.Errorf("RoundTrip returned %v and %v", resp, rerr)
	case checkDeadline && time.Since(start) > deadline:
		return false, fmt.Errorf("returned after %v, past its %v deadline", time.Since(start), deadline)
	case !reqBody.closed.Load():
		return false, fmt.Errorf("the request body was not closed")
	}
	if resp != nil {
		if resp.StatusCode == 200 {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
	}
	// Reuse, as net/http allows once the body is closed.
	req.Header.Set("X-Call", "reused")
	req.URL.Path = "/reused"
	return false, nil
}
