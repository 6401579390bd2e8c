package httptestutil

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/timing"
)

// RateLimitOptions configures a [RateLimit].
type RateLimitOptions struct {
	// PerSecond is the rate at which the bucket refills, in requests per
	// second. If zero or negative, it never refills: a quota spent once
	// Burst requests have been admitted.
	PerSecond float64

	// Burst is the bucket's capacity: how many requests may be admitted
	// at once after a quiet spell. If zero or negative, 1: one request
	// per 1/PerSecond and no more, as nginx's limit_req without its burst
	// parameter admits.
	Burst int

	// Status is the status of a refusal. If zero, 429 Too Many Requests.
	Status int

	// RetryAfter is the refusal's Retry-After header. If empty, "1", what
	// most rate-limited APIs send for a limit per second; "-" sends none.
	RetryAfter string

	// Delay is how long a refusal takes to be answered, the server's own
	// time to read the request and decide. If zero, it is answered at
	// once. Inside a testing/synctest bubble, a closed-loop client against
	// refusals that take no time never lets the clock move: give them
	// some.
	Delay time.Duration
}

// RateLimitStats counts what a [RateLimit] did.
type RateLimitStats struct {
	// Admitted counts the requests passed to the next handler, Refused
	// those answered with the refusal.
	Admitted, Refused int64
}

// RateLimit is an [http.Handler] in front of another that admits requests
// at a fixed rate with a token bucket, as an API's rate limit does, and
// answers the excess at once with 429 Too Many Requests and Retry-After: 1,
// without calling the next handler. The bucket holds Burst tokens, starts
// full, and refills at PerSecond; each admitted request takes a token, and
// a request that finds less than one is refused. The limiter keeps
// admitting its rate while it refuses: a client that stops for the whole
// Retry-After at each refusal loses that rate.
//
// Time is read with time.Now, so inside a testing/synctest bubble the rate
// is exact in virtual time. Create it with [NewRateLimit]; the zero value
// is not usable. It is safe for concurrent use.
type RateLimit struct {
	next  http.Handler
	rate  float64
	burst float64
	refusal

	mu     sync.Mutex
	tokens float64
	last   time.Time

	admitted, refused atomic.Int64
}

// NewRateLimit returns a RateLimit in front of next; a nil next is
// NewUpstream(Options{}), which answers 200 "ok" at once.
func NewRateLimit(next http.Handler, o RateLimitOptions) *RateLimit {
	if next == nil {
		next = NewUpstream(Options{})
	}
	l := &RateLimit{
		next:    next,
		rate:    o.PerSecond,
		burst:   float64(max(o.Burst, 1)),
		refusal: newRefusal(o.Status, http.StatusTooManyRequests, o.RetryAfter, o.Delay),
	}
	if !(l.rate > 0) { // NaN too
		l.rate = 0
	}
	l.tokens = l.burst
	return l
}

// ServeHTTP admits r to the next handler, or refuses it; see [RateLimit].
func (l *RateLimit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if l.take(time.Now()) {
		l.admitted.Add(1)
		l.next.ServeHTTP(w, r)
		return
	}
	l.refused.Add(1)
	l.refusal.write(w, r)
}

// take takes a token at now, if there is one.
func (l *RateLimit) take(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+l.rate*now.Sub(l.last).Seconds())
	}
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// Stats returns the counts so far.
func (l *RateLimit) Stats() RateLimitStats {
	return RateLimitStats{Admitted: l.admitted.Load(), Refused: l.refused.Load()}
}

// refusal is how an [Overload] or a [RateLimit] refuses a request: its
// status, its Retry-After ("" for none) and how long it waits first.
type refusal struct {
	status     int
	retryAfter string
	delay      time.Duration
}

// newRefusal returns the refusal the options describe: status, or def
// when zero; retryAfter, "1" when empty and none when "-"; delay.
func newRefusal(status, def int, retryAfter string, delay time.Duration) refusal {
	if status == 0 {
		status = def
	}
	switch retryAfter {
	case "":
		retryAfter = "1"
	case "-":
		retryAfter = ""
	}
	return refusal{status: status, retryAfter: retryAfter, delay: delay}
}

// write answers r with the refusal, after its delay, unless r's context
// ends first: then it writes nothing.
func (f refusal) write(w http.ResponseWriter, r *http.Request) {
	if !timing.Sleep(r.Context(), f.delay) {
		return
	}
	h := w.Header()
	if f.retryAfter != "" {
		h.Set("Retry-After", f.retryAfter)
	}
	h.Set("Content-Length", "0")
	w.WriteHeader(f.status)
}
