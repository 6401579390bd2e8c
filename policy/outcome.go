package policy

import (
	"net/http"
	"strconv"
)

// Outcome is what one wire attempt, or one call, says about the health of
// the dependency.
type Outcome uint8

const (
	// Success: the dependency answered as a healthy dependency does. A 404
	// is a success: the dependency is fine, the caller asked for something
	// that is not there.
	Success Outcome = iota + 1
	// Failure: the dependency failed, or could not be reached. Failures are
	// what the breaker counts and, unless Retry.If decides otherwise, what
	// Retry retries.
	Failure
	// Canceled: the caller gave up (its context was cancelled or its
	// deadline passed). Not evidence about the dependency: never retried,
	// never counted as a failure.
	Canceled
	// Discarded: resilix cancelled the attempt itself, as the loser of a
	// hedge race. Not evidence either: a discarded attempt records nothing
	// with the breaker and deposits nothing in the budget.
	Discarded
	// Rejected: a gate refused the call before it reached the wire. Used
	// only for calls, never returned by Classify.
	Rejected
	// Invalid: the request could not be sent as it is, and the base's
	// net/http refused it (an unsupported scheme, an invalid header,
	// method or Host, a URL with no Host, a body that does not match its
	// ContentLength), or the caller's body failed to read: the caller's
	// bug, not evidence about the dependency, which never saw it whole. Recognised before Classify is asked, never returned by it; an
	// invalid attempt is neither retried nor hedged, and records nothing
	// with any gate or the budget.
	Invalid
)

var outcomeNames = [...]string{"", "success", "failure", "canceled", "discarded", "rejected", "invalid"}

// String returns the outcome's name as it appears in metrics.
func (o Outcome) String() string { return enumName(outcomeNames[:], int(o), "outcome") }

// Evidence reports whether the outcome says anything about the dependency:
// true for Success and Failure only. Canceled, Discarded, Rejected and
// Invalid teach no policy anything.
func (o Outcome) Evidence() bool { return o == Success || o == Failure }

// A Classify func decides what one wire attempt says about the dependency.
// It is called with the response or the error of the base RoundTripper,
// exactly one of them non-nil, and must return Success or Failure; it must
// not read or close the body. Cancellation by the caller or by resilix is
// recognised before Classify is asked, so it never sees those, and so is a
// request that net/http refuses to send as it is (an Invalid attempt: an
// unsupported scheme, an invalid header, method or Host), which is no
// outcome at all; package transport lists the errors. It is called
// with no lock held, and concurrently for the legs of a hedged call, so it
// must be safe for concurrent use.
type Classify func(resp *http.Response, err error) Outcome

// DefaultClassify is the Classify used when Set.Classify is nil:
//
//   - any transport error (refused or reset connection, per-attempt timeout,
//     malformed response) is a Failure; a request net/http refused to send
//     never reaches it (see Classify);
//   - 5xx statuses except 501 Not Implemented are failures, and so are
//     429 Too Many Requests and 408 Request Timeout;
//   - every other status is a Success: other 4xx are the caller's problem
//     and say nothing bad about the dependency's health.
//
// Wrap it to change one case and keep the rest.
func DefaultClassify(resp *http.Response, err error) Outcome {
	if err != nil || resp == nil {
		return Failure
	}
	switch c := resp.StatusCode; {
	case c == http.StatusTooManyRequests, c == http.StatusRequestTimeout:
		return Failure
	case c >= 500 && c != http.StatusNotImplemented:
		return Failure
	}
	return Success
}

// enumName returns names[v], the name of an enum value as metrics and logs
// show it (snake_case), or typ(v), as "gate(9)", for a value with none:
// every enum of the package has this one fallback format.
func enumName(names []string, v int, typ string) string {
	if v >= 0 && v < len(names) && names[v] != "" {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(v) + ")"
}
