package transport

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Override narrows, for one call, what its key's policy.Set allows: fewer
// wire attempts, no retry, no hedge, a shorter per-attempt timeout. It
// never widens the set: a field asking for more than the set allows gets
// the set's, so the set still bounds the load a key can take. The call
// stays its key's: it passes the key's gates and spends and learns from
// the key's breaker, budget, limits and latency window like any other
// call (a Config.Key that moved it to another key would split that state).
//
// Put an Override in a request's context with WithOverride; RoundTrip
// reads it. The zero Override changes nothing. A retry or a hedge that an
// Override rules out is not reported to Observer.RetrySkipped or
// Observer.HedgeSuppressed: the caller turned it off, no gate stopped it.
type Override struct {
	// Attempts bounds the call's wire attempts, retries and hedges
	// together, the first included, as policy.Set.Attempts does. If zero,
	// the set's is kept; 1 is a single wire call, neither retried nor
	// hedged; a value above the set's is the set's. It must not be
	// negative.
	Attempts int

	// NoRetry, when true, turns the set's Retry off for the call; its
	// hedges, if the set hedges, are still sent.
	NoRetry bool

	// NoHedge, when true, turns the set's Hedge off for the call; its
	// retries, if the set retries, are still sent.
	NoHedge bool

	// PerAttempt bounds each of the call's wire attempts' time to
	// response headers, as policy.Timeout.PerAttempt does, whether or not
	// the set has a Timeout. If zero, the set's is kept; a value above the
	// set's is the set's. It must not be negative.
	PerAttempt time.Duration
}

type overrideKey struct{}

// WithOverride returns a copy of ctx under which requests run with o. When
// ctx already carries an Override, the two are combined field by field and
// the narrower of each is kept: the fewer Attempts and the shorter
// PerAttempt that is set, and NoRetry and NoHedge if either has them. An
// Override added deeper in a call stack narrows one added above it, and
// cannot widen it.
//
// A negative Attempts or PerAttempt has no narrowing to mean: RoundTrip
// then fails before any policy runs, with an error that names the field,
// and closes the request's body.
func WithOverride(ctx context.Context, o Override) context.Context {
	if prev, ok := OverrideFrom(ctx); ok {
		o = Override{
			Attempts:   narrower(prev.Attempts, o.Attempts),
			NoRetry:    prev.NoRetry || o.NoRetry,
			NoHedge:    prev.NoHedge || o.NoHedge,
			PerAttempt: narrower(prev.PerAttempt, o.PerAttempt),
		}
	}
	return context.WithValue(ctx, overrideKey{}, o)
}

// OverrideFrom returns the Override that ctx carries, as WithOverride
// combined it, and whether there is one.
func OverrideFrom(ctx context.Context) (Override, bool) {
	o, ok := ctx.Value(overrideKey{}).(Override)
	return o, ok
}

// narrower returns the smaller of a and b, zero meaning unset.
func narrower[T int | time.Duration](a, b T) T {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// check reports the fields of o that have no meaning, each by name.
func (o *Override) check() error {
	if o.Attempts >= 0 && o.PerAttempt >= 0 {
		return nil
	}
	var errs []error
	if o.Attempts < 0 {
		errs = append(errs, fmt.Errorf("resilix: Override.Attempts must be >= 0, got %d", o.Attempts))
	}
	if o.PerAttempt < 0 {
		errs = append(errs, fmt.Errorf("resilix: Override.PerAttempt must be >= 0, got %v", o.PerAttempt))
	}
	return errors.Join(errs...)
}
