package transport

import (
	"context"

	"github.com/resilix/resilix/policy"
)

// Report is what one call did, as its caller sees it once RoundTrip has
// returned: how many wire attempts it made, how many of them were retries
// and hedges, whether a hedge won, which gate refused it or its retry, why
// a retry was not sent, and, with Replicas, which lanes it went out on. It
// answers the question a response or an error alone leaves open ("503
// after how many attempts?") without an Observer correlated by context.
//
// Put one in a request's context with WithReport. RoundTrip writes it
// once, on the caller's goroutine, as it returns, and never after: a hedge
// leg that lost and is still on the wire does not touch it. A RoundTrip
// that panics (a base's or a user func's panic) does not write it.
//
// A Report is written without a lock: give each call in flight its own.
// Two RoundTrips running at once under one context with one Report race
// on it, and what it holds then says nothing reliable about either.
//
// RoundTrips running one after the other under one context, as
// http.Client's do when it follows a redirect, each overwrite the Report
// but for RoundTrips, which counts them: after Client.Do, the Report
// describes the last RoundTrip, the one whose response the caller holds,
// and RoundTrips is the number of hops. Reset it (r = Report{}) to reuse it
// for another call.
//
// The zero Report is ready to use.
type Report struct {
	// RoundTrips is how many RoundTrips have written the Report: 1 for a
	// call, one more per redirect http.Client followed.
	RoundTrips int

	// Outcome is that of what the last RoundTrip returned, as
	// policy.CallInfo.Outcome has it: Success, Failure, Canceled,
	// Rejected when a gate refused the call's first attempt, or Invalid.
	// It is zero when RoundTrip refused the request before any policy ran
	// (an Override with a negative field).
	Outcome policy.Outcome

	// StatusCode is the status of the response returned, or 0 with an
	// error.
	StatusCode int

	// WireAttempts is how many attempts reached the base RoundTripper:
	// the first, the retries and the hedges, as policy.CallInfo has it.
	WireAttempts int

	// Retries is how many retries were sent: a retry a gate refused, or
	// whose body could not be replayed, is not counted.
	Retries int

	// Hedges is how many hedge legs were started, over all the call's
	// rounds; HedgeWon says that one of them answered the call, with a
	// Success (Observer.HedgeWon's).
	Hedges   int
	HedgeWon bool

	// Exhausted says that the answer returned asked for a retry and the
	// call had none of its attempts (policy.Set.Attempts, or an
	// Override's) left. It is false for a call that does not retry.
	Exhausted bool

	// Skipped is why the retry the answer returned asked for was not sent
	// (Observer.RetrySkipped's reason), or zero when none was skipped:
	// the call needed no retry, or ran out of attempts (Exhausted).
	Skipped policy.SkipReason

	// Refusal is the refusal that ended the call (Outcome Rejected, no
	// attempt sent) or stopped its retry (Skipped is then SkipGate, and
	// the last answer is returned); nil when no gate refused either. Gate
	// is its gate, and Refusal.Err its reason: policy.ErrCircuitOpen,
	// policy.ErrIsolated, policy.ErrShed, .... A hedge a gate refused is
	// not reported here: it ends neither the call nor a retry.
	Gate    policy.Gate
	Refusal *policy.RejectedError

	// Lanes, with Replicas, is the set of lanes the call sent on, bit i
	// for the lane of index i (policy.LaneEjection.Index); bits.OnesCount64
	// counts them. Lane names the lane of the attempt whose answer was
	// returned, as policy.AttemptInfo.Lane does: its address, or its
	// index. Both are zero without Replicas, or with no attempt sent.
	Lanes uint64
	Lane  string
}

type reportKey struct{}

// WithReport returns a copy of ctx under which RoundTrip writes what each
// call does to r (see Report). A nil r turns reporting off under the
// returned context, for a Report an outer caller put in ctx.
func WithReport(ctx context.Context, r *Report) context.Context {
	return context.WithValue(ctx, reportKey{}, r)
}

// reportOf returns the Report ctx carries, or nil.
func reportOf(ctx context.Context) *Report {
	r, _ := ctx.Value(reportKey{}).(*Report)
	return r
}
