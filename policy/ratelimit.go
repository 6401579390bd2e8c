package policy

import (
	"context"
	"math"
	"sync"
	"time"
)

// RateLimit is a token bucket per scope: at most PerSecond calls per
// second on average, Burst at once.
type RateLimit struct {
	// PerSecond is the sustained rate. Required: it must be > 0.
	PerSecond float64

	// Burst is the bucket's size, at most 2^53, the most tokens it counts
	// exactly. If zero, max(1, ceil(PerSecond/10)) is used, so a PerSecond
	// above 10·2^53 needs a Burst set.
	Burst int

	// MaxWait is how long a call waits for a token. If zero, a call that
	// finds no token fails at once with ErrRateLimited and a RetryAfter
	// hint. A wait never outlives the caller's deadline.
	MaxWait time.Duration
}

func (r *RateLimit) validate() error {
	return joinErrs(
		fieldErrIf(!(r.PerSecond > 0) || math.IsInf(r.PerSecond, 1),
			"RateLimit.PerSecond", "must be > 0, got %v", r.PerSecond),
		fieldErrIf(r.Burst < 0, "RateLimit.Burst", "must be >= 0, got %d", r.Burst),
		fieldErrIf(int64(r.Burst) > 1<<53,
			"RateLimit.Burst", "must be <= 2^53, the most tokens the bucket counts exactly, got %d", r.Burst),
		fieldErrIf(r.Burst == 0 && !math.IsInf(r.PerSecond, 0) && math.Ceil(r.PerSecond/10) > 1<<53,
			"RateLimit.Burst", "is zero and its default, ceil(RateLimit.PerSecond/10) = %v, is above 2^53, the most tokens the bucket counts exactly; set it",
			math.Ceil(r.PerSecond/10)),
		fieldErrIf(r.MaxWait < 0, "RateLimit.MaxWait", "must be >= 0, got %v", r.MaxWait),
	)
}

// WithDefaults returns r with every zero field set to its default.
func (r RateLimit) WithDefaults() RateLimit {
	if r.Burst == 0 {
		r.Burst = max(1, int(math.Ceil(r.PerSecond/10)))
	}
	return r
}

// RateLimiter is the runtime state of a RateLimit, one per scope: a token
// bucket that holds at most Burst tokens and gains PerSecond of them per
// second, starting full. It is the algorithm of golang.org/x/time/rate,
// computed lazily from the now passed in (no timer runs for an idle
// scope), with waiting bounded by MaxWait and the caller's deadline.
//
// Every attempt that passes the gate spends one token, retries and hedges
// included. The token is spent for good when the attempt is admitted, so
// there is nothing to release afterwards, whatever the attempt's outcome.
//
// Acquire is the method to call. It does not allocate unless it waits
// (then one timer). A refusal is reported to the caller as ErrRateLimited
// with a RetryAfter hint: the time until the bucket holds a token, if
// nobody else takes it first.
//
// A nil *RateLimiter is a rate limit that is off: it admits everything. A
// RateLimiter is safe for concurrent use.
type RateLimiter struct {
	perSec  float64
	burst   float64
	maxWait time.Duration

	mu     sync.Mutex
	tokens float64   // at last; negative while waiters hold tokens not yet accrued
	last   time.Time // when tokens was brought up to date
	tail   time.Time // when the last reservation's token comes due
}

// NewRateLimiter returns the runtime state of r with a full bucket. r must
// be valid (PerSecond > 0); Set.Validate checks it.
func NewRateLimiter(r RateLimit) *RateLimiter {
	r = r.WithDefaults()
	return &RateLimiter{
		perSec:  r.PerSecond,
		burst:   float64(r.Burst),
		maxWait: max(r.MaxWait, 0),
		tokens:  float64(r.Burst),
	}
}

// Acquire spends one token at now and reports whether the call may go on.
//
// When the bucket is empty and MaxWait is zero, it refuses at once. With
// MaxWait > 0 it takes the next token ahead of time and sleeps until it is
// due, if that is at most MaxWait away and before ctx's deadline; otherwise
// it refuses at once, taking nothing, rather than wait for nothing. A wait
// cut short by ctx gives the token back when no later caller has queued
// behind it, and refuses with a zero hint. retryAfter is the hint on a
// refusal, and zero on success.
//
// now is the current time, as from time.Now; the wait itself runs on the
// runtime's timers.
func (l *RateLimiter) Acquire(ctx context.Context, now time.Time) (ok bool, retryAfter time.Duration) {
	if l == nil {
		return true, 0
	}
	var limit time.Duration // the longest this call may wait
	if l.maxWait > 0 {
		limit = l.maxWait
		if deadline, ok := ctx.Deadline(); ok {
			limit = min(limit, deadline.Sub(now)-1) // the wait must end before it
		}
	}
	l.mu.Lock()
	l.advance(now)
	if l.tokens >= 1 {
		l.tokens--
		l.mu.Unlock()
		return true, 0
	}
	wait := l.until(1)
	if wait > limit {
		l.mu.Unlock()
		return false, wait
	}
	l.tokens--
	due := now.Add(wait)
	l.tail = due
	l.mu.Unlock()

	if ctx.Err() != nil {
		l.cancel(due, now)
		return false, wait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true, 0
	case <-ctx.Done():
		l.cancel(due, time.Now())
		return false, 0
	}
}

// advance brings the bucket up to date at now. l.mu is held. A now before
// the last update changes nothing.
func (l *RateLimiter) advance(now time.Time) {
	if dt := now.Sub(l.last); dt > 0 {
		l.tokens = min(l.burst, l.tokens+l.perSec*dt.Seconds())
		l.last = now
	}
}

// until returns how long until the bucket holds n tokens, rounded up to the
// nanosecond. l.mu is held and the bucket is up to date.
func (l *RateLimiter) until(n float64) time.Duration {
	missing := n - l.tokens
	if missing <= 0 {
		return 0
	}
	d := math.Ceil(missing / l.perSec * float64(time.Second))
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// cancel gives back the token of a wait that ended at now, before it was
// due. Only the last reservation's token is given back: a later caller's
// due time was computed after this token was taken, and it would go early
// if the token came back. Erring this way only ever admits less.
func (l *RateLimiter) cancel(due, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(due) || !due.Equal(l.tail) {
		return
	}
	l.advance(now)
	l.tokens = min(l.burst, l.tokens+1)
	l.tail = time.Time{}
}

// Tokens returns the tokens in the bucket at now; negative while waiters
// hold tokens that have not accrued yet.
func (l *RateLimiter) Tokens(now time.Time) float64 {
	if l == nil {
		return math.Inf(1)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tokens := l.tokens
	if dt := now.Sub(l.last); dt > 0 {
		tokens = min(l.burst, tokens+l.perSec*dt.Seconds())
	}
	return tokens
}
