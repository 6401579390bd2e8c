package policy

import (
	"time"
)

// Bulkhead caps the calls in flight to one scope.
type Bulkhead struct {
	// MaxConcurrent is the most calls in flight at once. Required: it
	// must be > 0.
	MaxConcurrent int

	// MaxWait is how long a call waits for a free slot. If zero, a call
	// that finds the bulkhead full fails at once with ErrBulkheadFull.
	// A wait never outlives the caller's deadline.
	MaxWait time.Duration
}

func (b *Bulkhead) validate() error {
	return joinErrs(
		fieldErrIf(b.MaxConcurrent <= 0, "Bulkhead.MaxConcurrent", "must be > 0, got %d", b.MaxConcurrent),
		fieldErrIf(b.MaxWait < 0, "Bulkhead.MaxWait", "must be >= 0, got %v", b.MaxWait),
	)
}
