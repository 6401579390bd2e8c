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
