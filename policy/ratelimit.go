package policy

import (
	"math"
	"time"
)

// RateLimit is a token bucket per scope: at most PerSecond calls per
// second on average, Burst at once.
type RateLimit struct {
	// PerSecond is the sustained rate. Required: it must be > 0.
	PerSecond float64

	// Burst is the bucket's size. If zero, max(1, ceil(PerSecond/10)) is
	// used.
	Burst int

	// MaxWait is how long a call waits for a token. If zero, a call that
	// finds no token fails at once with ErrRateLimited and a RetryAfter
	// hint. A wait never outlives the caller's deadline.
	MaxWait time.Duration
}

func (r *RateLimit) validate() error {
	switch {
	case !(r.PerSecond > 0) || math.IsInf(r.PerSecond, 1):
		return fieldErr("RateLimit.PerSecond", "must be > 0, got %v", r.PerSecond)
	case r.Burst < 0:
		return fieldErr("RateLimit.Burst", "must be >= 0, got %d", r.Burst)
	case r.MaxWait < 0:
		return fieldErr("RateLimit.MaxWait", "must be >= 0, got %v", r.MaxWait)
	}
	return nil
}

// WithDefaults returns r with every zero field set to its default.
func (r RateLimit) WithDefaults() RateLimit {
	if r.Burst == 0 {
		r.Burst = max(1, int(math.Ceil(r.PerSecond/10)))
	}
	return r
}
