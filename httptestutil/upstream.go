package httptestutil

import (
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/timing"
)

// Fault is a failure an [Upstream] injects into a response.
//
// An Upstream checks its faults in order for each admitted request, after
// sampling the latency; the first fault that applies is used and the others
// are skipped. A fault changes the response after the sampled latency: it
// may delay the headers (SlowHeaders), abort the connection (Reset), replace
// the status (Status, RetryAfter) and stream the body slowly (SlowBody).
// These combine: Fault{Probability: 1, SlowHeaders: time.Second, Status: 503}
// answers 503 a second late.
type Fault struct {
	// Probability is the chance, per request, that this fault applies.
	// 1 or more means always; 0 or less means never, so a zero Fault is
	// inert. A probability strictly between 0 and 1 draws one random
	// number per check; 0 and 1 draw none.
	Probability float64

	// Status is the response status. If zero, the status is 200 OK.
	Status int

	// RetryAfter, if not empty, is sent as the Retry-After header, for
	// example "2" or an HTTP date.
	RetryAfter string

	// Reset aborts the connection instead of responding, after the latency
	// and SlowHeaders; Status, RetryAfter and SlowBody are then ignored. Over a real connection the Upstream hijacks it and
	// closes it with SO_LINGER 0, so the client sees a TCP RST
	// (ECONNRESET). Through [InMemory] the round trip fails with an error
	// matching errors.Is(err, syscall.ECONNRESET). Where the connection
	// cannot be hijacked (HTTP/2, other ResponseWriters) the handler panics
	// with [http.ErrAbortHandler], which servers and [InMemory] treat as an
	// aborted response.
	Reset bool

	// SlowHeaders is an extra delay before the response headers are sent,
	// added to the sampled latency. If zero or negative, there is none.
	SlowHeaders time.Duration

	// SlowBody, if positive, makes the Upstream send the headers at once
	// and then the body in Options.Chunks chunks with this delay between
	// consecutive chunks (no delay before the first or after the last).
	// The whole body is still delivered.
	SlowBody time.Duration
}

// Options configures an [Upstream]. The zero value is an upstream that
// answers every request at once with 200 OK and the body "ok".
type Options struct {
	// Latency is the delay before each admitted request is answered,
	// sampled on arrival. If nil, Constant(0) is used.
	Latency Latency

	// Faults are checked in order for each admitted request; the first
	// that applies wins. The slice is copied.
	Faults []Fault

	// Seed seeds the PCG generator used for latencies and faults. The same
	// seed and the same arrival order give the same samples. Zero is a
	// valid seed.
	Seed uint64

	// Capacity, if positive, is the number of requests served at once.
	// A request arriving while Capacity requests are in flight is answered
	// immediately with OverCapacityStatus, without latency or faults. If
	// zero or negative, the capacity is unlimited.
	Capacity int

	// Queue makes a full Upstream queue requests instead of refusing
	// them: a server with Capacity workers and an unbounded accept queue,
	// whose latency grows with its backlog, as real servers' does. A
	// queued request whose context ends leaves the queue and is counted as
	// Canceled.
	Queue bool

	// OverCapacityStatus is the status of requests refused for capacity.
	// If zero, 503 Service Unavailable is used.
	OverCapacityStatus int

	// BodySize is the size in bytes of every response body (except for
	// HEAD requests and over-capacity refusals, which have none). The body
	// repeats "ok\n" and is cut to size, so the default is "ok". If zero, 2
	// is used; if negative, the body is empty.
	BodySize int

	// Chunks is the number of chunks a SlowBody fault splits the body
	// into. It is capped at the body size. If zero or negative, 4 is used.
	Chunks int

	// KeepBodies is how many request bodies to keep for inspection through
	// [Stats].Bodies: the first KeepBodies arrivals since the start or the
	// last [Upstream.ResetStats]. If zero or negative, none is kept. Every
	// request body is read to the end either way.
	KeepBodies int
}

// Stats is a snapshot of an [Upstream]'s counters.
type Stats struct {
	// Requests counts arrivals, admitted or not.
	Requests int64
	// ByMethod counts arrivals by request method.
	ByMethod map[string]int64
	// InFlight is the number of admitted requests whose handler has not
	// returned.
	InFlight int64
	// PeakInFlight is the largest InFlight seen. With a Capacity it never
	// exceeds the Capacity.
	PeakInFlight int64
	// Canceled counts admitted requests the handler gave up on because the
	// request's context was done or the response could not be written:
	// the client went away (or, in memory, closed the body early) before
	// the handler finished.
	Canceled int64
	// OverCapacity counts requests refused because the Upstream was full.
	OverCapacity int64
	// Bodies holds the kept request bodies in arrival order (see
	// Options.KeepBodies). A body still being read is nil.
	Bodies [][]byte
}

// Upstream is an [http.Handler] that simulates a slow or failing dependency.
//
// For each request it reads and records the request body, checks the
// capacity, samples the latency, waits for it, applies the first fault that
// applies, and writes the response body. Waits end as soon as the request's
// context is done, in which case the handler returns without responding.
//
// Serve it over loopback with httptest.NewServer(u), or in memory with
// [Upstream.RoundTripper], which also works inside [testing/synctest]
// bubbles. Create it with [NewUpstream]; the zero value is not usable. It is
// safe for concurrent use, and its latency and faults can be changed while
// it serves.
type Upstream struct {
	capacity   int64
	overStatus int
	slots      chan struct{} // with Queue: one token per worker
	body       []byte
	chunks     int
	keep       int

	mu      sync.Mutex // guards rng, latency, faults
	rng     *rand.Rand
	latency Latency
	faults  []Fault

	requests     atomic.Int64
	inFlight     atomic.Int64
	peak         atomic.Int64
	canceled     atomic.Int64
	overCapacity atomic.Int64

	statsMu  sync.Mutex // guards byMethod, bodies, gen
	byMethod map[string]int64
	bodies   [][]byte
	gen      uint64 // incremented by ResetStats, so late body reads are dropped
}

// NewUpstream returns an Upstream configured by o.
func NewUpstream(o Options) *Upstream {
	u := &Upstream{
		capacity:   int64(max(o.Capacity, 0)),
		overStatus: o.OverCapacityStatus,
		chunks:     o.Chunks,
		keep:       max(o.KeepBodies, 0),
		rng:        rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		latency:    o.Latency,
		faults:     append([]Fault(nil), o.Faults...),
		byMethod:   make(map[string]int64),
	}
	if u.overStatus == 0 {
		u.overStatus = http.StatusServiceUnavailable
	}
	if u.chunks <= 0 {
		u.chunks = 4
	}
	if u.latency == nil {
		u.latency = Constant(0)
	}
	size := o.BodySize
	if size == 0 {
		size = 2
	}
	if size > 0 {
		u.body = make([]byte, size)
		for i := range u.body {
			u.body[i] = "ok\n"[i%3]
		}
	}
	if o.Queue && o.Capacity > 0 {
		u.slots = make(chan struct{}, o.Capacity)
	}
	return u
}

// SetLatency replaces the latency distribution, for example to start or
// end a brownout. Requests already waiting keep the latency they sampled on
// arrival. A nil l means Constant(0). It is safe to call concurrently with
// requests.
func (u *Upstream) SetLatency(l Latency) {
	if l == nil {
		l = Constant(0)
	}
	u.mu.Lock()
	u.latency = l
	u.mu.Unlock()
}

// SetFaults replaces the faults; with no arguments, it removes them.
// Requests already admitted keep the fault they drew. It is safe to call
// concurrently with requests.
func (u *Upstream) SetFaults(f ...Fault) {
	f = append([]Fault(nil), f...)
	u.mu.Lock()
	u.faults = f
	u.mu.Unlock()
}

// Stats returns a snapshot of the counters. The snapshot owns its map and
// byte slices.
func (u *Upstream) Stats() Stats {
	s := Stats{
		InFlight:     u.inFlight.Load(),
		PeakInFlight: u.peak.Load(),
		Canceled:     u.canceled.Load(),
		OverCapacity: u.overCapacity.Load(),
	}
	u.statsMu.Lock()
	defer u.statsMu.Unlock()
	s.Requests = u.requests.Load()
	s.ByMethod = make(map[string]int64, len(u.byMethod))
	for m, n := range u.byMethod {
		s.ByMethod[m] = n
	}
	if len(u.bodies) > 0 {
		s.Bodies = make([][]byte, len(u.bodies))
		for i, b := range u.bodies {
			if b != nil {
				s.Bodies[i] = append([]byte{}, b...)
			}
		}
	}
	return s
}

// ResetStats zeroes the counters and forgets the kept bodies, for example
// between the phases of a demo. InFlight is not a counter and is kept;
// PeakInFlight restarts from the current InFlight. The latency generator is
// not reseeded. Requests in flight during the reset are counted in the new
// phase only for what happens to them afterwards.
func (u *Upstream) ResetStats() {
	u.statsMu.Lock()
	u.byMethod = make(map[string]int64)
	u.bodies = nil
	u.gen++
	u.requests.Store(0)
	u.canceled.Store(0)
	u.overCapacity.Store(0)
	u.peak.Store(u.inFlight.Load())
	u.statsMu.Unlock()
}

// RoundTripper returns an in-memory [http.RoundTripper] that serves every
// request with u, without sockets; see [InMemory].
func (u *Upstream) RoundTripper() http.RoundTripper { return InMemory(u) }

// Client returns an [http.Client] whose transport is u.RoundTripper().
func (u *Upstream) Client() *http.Client {
	return &http.Client{Transport: u.RoundTripper()}
}

// ServeHTTP serves one request; see [Upstream].
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.arrive(r)

	if u.slots != nil {
		select {
		case u.slots <- struct{}{}:
			defer func() { <-u.slots }()
		case <-r.Context().Done():
			u.canceled.Add(1)
			return
		}
	}
	if !u.admit() {
		u.overCapacity.Add(1)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(u.overStatus)
		return
	}
	defer u.inFlight.Add(-1)
	if !u.serve(w, r) {
		u.canceled.Add(1)
	}
}

// serve answers an admitted request. It reports false if it gave up because
// the request's context was done or the body could not be written.
func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) bool {
	ctx := r.Context()
	u.mu.Lock()
	delay := u.latency.Sample(u.rng)
	var fault Fault
	for _, f := range u.faults {
		if f.Probability >= 1 || (f.Probability > 0 && u.rng.Float64() < f.Probability) {
			fault = f
			break
		}
	}
	u.mu.Unlock()

	if !timing.Sleep(ctx, delay) || !timing.Sleep(ctx, fault.SlowHeaders) {
		return false
	}
	if fault.Reset {
		reset(w)
		return true
	}

	h := w.Header()
	if fault.RetryAfter != "" {
		h.Set("Retry-After", fault.RetryAfter)
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(u.body)))
	status := fault.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead || len(u.body) == 0 {
		return true
	}
	if fault.SlowBody <= 0 {
		_, err := w.Write(u.body)
		return err == nil
	}

	rc := http.NewResponseController(w)
	rc.Flush() // headers first
	n := min(u.chunks, len(u.body))
	for i := range n {
		if i > 0 && !timing.Sleep(ctx, fault.SlowBody) {
			return false
		}
		chunk := u.body[i*len(u.body)/n : (i+1)*len(u.body)/n]
		if _, err := w.Write(chunk); err != nil {
			return false
		}
		rc.Flush()
	}
	return true
}

// arrive counts r and reads its body, keeping it if it is among the first
// KeepBodies arrivals.
func (u *Upstream) arrive(r *http.Request) {
	u.statsMu.Lock()
	u.requests.Add(1) // under statsMu, so Requests matches ByMethod
	u.byMethod[r.Method]++
	slot, gen := -1, u.gen
	if len(u.bodies) < u.keep {
		slot = len(u.bodies)
		u.bodies = append(u.bodies, nil)
	}
	u.statsMu.Unlock()

	if r.Body == nil {
		if slot >= 0 {
			u.keepBody(slot, gen, []byte{})
		}
		return
	}
	if slot < 0 {
		io.Copy(io.Discard, r.Body)
		return
	}
	b, _ := io.ReadAll(r.Body)
	if b == nil {
		b = []byte{}
	}
	u.keepBody(slot, gen, b)
}

func (u *Upstream) keepBody(slot int, gen uint64, b []byte) {
	u.statsMu.Lock()
	if u.gen == gen {
		u.bodies[slot] = b
	}
	u.statsMu.Unlock()
}

// admit takes an in-flight slot if the capacity allows, and updates the
// peak. The in-flight count never exceeds the capacity, even transiently.
func (u *Upstream) admit() bool {
	for {
		n := u.inFlight.Load()
		if u.capacity > 0 && n >= u.capacity {
			return false
		}
		if u.inFlight.CompareAndSwap(n, n+1) {
			n++
			for {
				p := u.peak.Load()
				if n <= p || u.peak.CompareAndSwap(p, n) {
					return true
				}
			}
		}
	}
}

// reset aborts the connection behind w: with a TCP RST if it can be
// hijacked, otherwise by panicking with http.ErrAbortHandler.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	c := conn
	for {
		if tcp, ok := c.(*net.TCPConn); ok {
			tcp.SetLinger(0)
			break
		}
		nc, ok := c.(interface{ NetConn() net.Conn }) // *tls.Conn
		if !ok {
			break
		}
		c = nc.NetConn()
	}
	// Closing the TCP connection directly, not the TLS one, so no
	// close_notify is sent before the RST.
	c.Close()
	if c != conn {
		conn.Close()
	}
}
