package policy

import "time"

// Timeout bounds one wire attempt's time to response headers and, with
// Idle, each wait for the next bytes of its response body.
//
// Once headers arrive the body streams under the caller's context, so a
// long download is never cut by PerAttempt; the attempt's context and timer
// are released when the caller closes the body or reads it to EOF. An
// attempt cut short returns an error that matches both ErrAttemptTimeout
// and context.DeadlineExceeded, is classified a Failure, and may be
// retried; the caller's own deadline matches only
// context.DeadlineExceeded. A timeout the client ended 20 ms or more
// after its deadline is the client's own stall (a GC pause, CPU
// starvation, a SIGSTOP), not the dependency's silence: the caller and
// the retry see it as any other, but no gate counts it (see
// AttemptInfo.Stalled).
type Timeout struct {
	// PerAttempt is the longest one attempt may wait for response headers.
	// If zero, 10s is used.
	PerAttempt time.Duration

	// Idle bounds a stalled response body: a Read of the body that has
	// waited Idle for the next bytes (and at most a quarter more) fails
	// with an error that matches ErrAttemptTimeout and
	// context.DeadlineExceeded and is a net.Error whose Timeout is true.
	// The attempt's context is cancelled, which makes net/http end the
	// Read and release the connection, and as the Read fails the
	// attempt's bulkhead slot is freed; a base that ignores cancellation
	// cannot be hurried, and keeps its slot until the body is closed.
	// Only a Read that waits counts: a caller that pauses between reads
	// is never cut, nor a slow stream whose bytes keep coming. The call
	// is not retried: its response, partly read, is already the
	// caller's. A 101 Switching Protocols body is never bounded. If zero,
	// there is no bound: a body that stalls waits for the caller's
	// context. It must not be negative.
	//
	// It costs one timer per response body, woken four times per Idle
	// while the body is open, and two atomic adds per Read.
	Idle time.Duration
}

func (t *Timeout) validate() error {
	return joinErrs(
		fieldErrIf(t.PerAttempt < 0, "Timeout.PerAttempt", "must be >= 0, got %v", t.PerAttempt),
		fieldErrIf(t.Idle < 0, "Timeout.Idle", "must be >= 0, got %v", t.Idle),
	)
}

// WithDefaults returns t with every zero field set to its default. Idle
// has none: zero is off.
func (t Timeout) WithDefaults() Timeout {
	t.PerAttempt = or(t.PerAttempt, 10*time.Second)
	return t
}
