package httptestutil

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// OverloadOptions configures an [Overload].
type OverloadOptions struct {
	// Status is the status of a refusal. If zero, 503 Service
	// Unavailable.
	Status int

	// RetryAfter is the refusal's Retry-After header. If empty, "1"; "-"
	// sends none.
	RetryAfter string

	// Delay is how long a refusal takes to be answered. If zero, it is
	// answered at once; see RateLimitOptions.Delay for why a test in a
	// testing/synctest bubble may want some.
	Delay time.Duration
}

// OverloadStats counts what an [Overload] did.
type OverloadStats struct {
	// Served counts the requests passed to the next handler, Refused
	// those answered with the refusal while overloaded.
	Served, Refused int64
}

// Overload is an [http.Handler] in front of another that can be put into
// overload for a while: then it answers every request at once with 503
// Service Unavailable and Retry-After: 1, without calling the next
// handler, as a server shedding everything does; otherwise it passes
// requests on. Unlike a [RateLimit], an overloaded server admits nothing,
// so a client that stops sending for the Retry-After loses nothing.
//
// [Overload.Begin] starts an overload of a given length; it ends by
// itself, with no timer, when the first request after its end finds it
// over. Time is read with time.Now, so inside a testing/synctest bubble
// the overload lasts exactly its length in virtual time. Create it with
// [NewOverload]; the zero value is not usable. It is safe for concurrent
// use.
type Overload struct {
	next http.Handler
	refusal

	mu    sync.Mutex
	until time.Time

	served, refused atomic.Int64
}

// NewOverload returns an Overload in front of next, not overloaded; a nil
// next is NewUpstream(Options{}), which answers 200 "ok" at once.
func NewOverload(next http.Handler, o OverloadOptions) *Overload {
	if next == nil {
		next = NewUpstream(Options{})
	}
	return &Overload{next: next, refusal: newRefusal(o.Status, http.StatusServiceUnavailable, o.RetryAfter, o.Delay)}
}

// Begin overloads the server from now for d, replacing any overload in
// progress; a d of zero or less ends it.
func (o *Overload) Begin(d time.Duration) {
	o.mu.Lock()
	o.until = time.Now().Add(max(d, 0))
	o.mu.Unlock()
}

// Overloaded reports whether the server is overloaded now.
func (o *Overload) Overloaded() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return time.Now().Before(o.until)
}

// ServeHTTP refuses r while overloaded and passes it on otherwise; see
// [Overload].
func (o *Overload) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !o.Overloaded() {
		o.served.Add(1)
		o.next.ServeHTTP(w, r)
		return
	}
	o.refused.Add(1)
	o.refusal.write(w, r)
}

// Stats returns the counts so far.
func (o *Overload) Stats() OverloadStats {
	return OverloadStats{Served: o.served.Load(), Refused: o.refused.Load()}
}
