package policy

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/resilix/resilix/shedding"
)

// ErrRejected matches every refusal by a resilix gate:
// errors.Is(err, ErrRejected) is true whichever gate said no. Each gate also
// has its own sentinel below, and both are carried by one *RejectedError.
var ErrRejected = errors.New("resilix: rejected")

// The per-gate sentinels. Each is matched by errors.Is on the *RejectedError
// that the gate returns, as is ErrRejected: ErrCircuitOpen by the Breaker,
// ErrBulkheadFull by the Bulkhead, ErrRateLimited by the RateLimit, ErrShed
// by the Limiter when it sheds by priority or a full queue. (The budget
// refuses no call: a retry it refuses leaves the caller with the last
// response, and a hedge it refuses is not sent; Observer.RetrySkipped and
// Observer.HedgeSuppressed report both.)
var (
	ErrCircuitOpen  = errors.New("resilix: circuit open")
	ErrBulkheadFull = errors.New("resilix: bulkhead full")
	ErrRateLimited  = errors.New("resilix: rate limited")
	ErrShed         = errors.New("resilix: shed")
)

// ErrThrottled is the adaptive throttler's refusal. Throttling is shedding
// by another gate, so it also matches ErrShed.
var ErrThrottled error = &kindOf{msg: "resilix: throttled", parent: ErrShed}

// ErrIsolated is the refusal of a key an operator isolated
// (transport.Transport.Isolate): its breaker is held open by hand, so it
// also matches ErrCircuitOpen, and its RejectedError has GateBreaker and no
// RetryAfter, since nothing but a Release ends it.
var ErrIsolated error = &kindOf{msg: "resilix: isolated", parent: ErrCircuitOpen}

// kindOf is a sentinel that is also a kind of a broader sentinel.
type kindOf struct {
	msg    string
	parent error
}

func (e *kindOf) Error() string { return e.msg }
func (e *kindOf) Unwrap() error { return e.parent }

// ErrAttemptTimeout is the cause of a wire attempt that Timeout.PerAttempt
// cut short before response headers arrived. The error such an attempt
// returns matches both it and context.DeadlineExceeded; the caller's own
// deadline matches only the latter.
var ErrAttemptTimeout = errors.New("resilix: attempt timed out")

// Gate names the admission gate that refused a call.
type Gate uint8

// The admission gates, in the order a wire attempt meets them, then the
// server's, in the order a request meets them in package admission.
const (
	GateThrottler Gate = iota + 1
	GateBreaker
	GateLimiter
	GateBulkhead
	GateRateLimit
	// GateDeadline: a server refused a request whose propagated deadline
	// had passed, or left less than admission.Config.MinTimeout, before
	// its handler ran. Its error matches context.DeadlineExceeded.
	GateDeadline
	// GateAdmission: a server's adaptive concurrency limiter (package
	// admission) refused a request before its handler ran. Its error
	// matches ErrShed.
	GateAdmission
)

var gateNames = [...]string{"", "throttler", "breaker", "limiter", "bulkhead", "rate_limit", "deadline", "admission"}

// String returns the gate's name as it appears in metrics: "breaker",
// "rate_limit", ...
func (g Gate) String() string { return enumName(gateNames[:], int(g), "gate") }

// RejectedError is the one error type of every refusal. It matches
// ErrRejected and its own sentinel (Err) with errors.Is, through
// *url.Error and any other wrapper that unwraps.
type RejectedError struct {
	Gate     Gate
	Err      error // the gate's sentinel, e.g. ErrCircuitOpen
	Key      string
	Priority shedding.Priority
	// RetryAfter, when positive, is the gate's estimate of how long until
	// it would admit a call like this one.
	RetryAfter time.Duration
}

// Error says which gate refused, for which key and priority, and when it
// might admit again: `resilix: circuit open (key "api:443", priority
// critical, retry after 2s)`.
func (e *RejectedError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	b.WriteString(" (key ")
	b.WriteString(strconv.Quote(e.Key))
	b.WriteString(", priority ")
	b.WriteString(e.Priority.String())
	if e.RetryAfter > 0 {
		b.WriteString(", retry after ")
		b.WriteString(e.RetryAfter.String())
	}
	b.WriteByte(')')
	return b.String()
}

// Is reports whether target is ErrRejected.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// Unwrap returns the gate's sentinel.
func (e *RejectedError) Unwrap() error { return e.Err }
