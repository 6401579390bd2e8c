package policy

import "time"

// Timeout bounds one wire attempt's time to response headers.
//
// Once headers arrive the body streams under the caller's context, so a
// long download is never cut by PerAttempt; the attempt's context and timer
// are released when the caller closes the body or reads it to EOF. An
// attempt cut short returns an error that matches both ErrAttemptTimeout
// and context.DeadlineExceeded, is classified a Failure, and may be
// retried; the caller's own deadline matches only
// context.DeadlineExceeded.
type Timeout struct {
	// PerAttempt is the longest one attempt may wait for response headers.
	// If zero, 10s is used.
	PerAttempt time.Duration
}

func (t *Timeout) validate() error {
	return fieldErrIf(t.PerAttempt < 0, "Timeout.PerAttempt", "must be >= 0, got %v", t.PerAttempt)
}

// WithDefaults returns t with every zero field set to its default.
func (t Timeout) WithDefaults() Timeout {
	t.PerAttempt = or(t.PerAttempt, 10*time.Second)
	return t
}
