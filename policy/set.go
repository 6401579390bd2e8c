package policy

import (
	"errors"
	"fmt"
)

// Set is the configuration of one chain: which policies run and how. The
// chain's order is fixed,
//
//	Retry → Hedge → Throttler → Breaker → Limiter → Bulkhead → RateLimit → Timeout → base
//
// and a nil policy is off. A non-nil zero-valued policy is on with the
// defaults its fields document, which are the recommended production
// settings. Configs are values: transport.New copies what it needs, so
// changing a Set after New has no effect.
type Set struct {
	// Attempts is the number of wire calls one logical call may make,
	// retries and hedges together, the first included. One number bounds
	// the load a call can add. With Replicas, the retry of an attempt that
	// never reached a server, sent to a replica the call has not used,
	// is not counted (see "What never left" in package transport).
	//
	// If zero, it is 3 when Retry or Hedge is set and 1 otherwise. It must
	// not be negative; a value above 1 needs Retry or Hedge, and Retry or
	// Hedge needs a value above 1 (or zero), since with one wire call there
	// is nothing to retry or hedge.
	Attempts int

	// Classify decides whether an attempt succeeded or failed as far as the
	// dependency's health goes; failures are what the Breaker counts and,
	// unless Retry.If decides otherwise, what Retry retries. If nil,
	// DefaultClassify is used.
	Classify Classify

	// Budget bounds retries and hedges together, those that fail or lose,
	// as a fraction of the calls made. The zero value is the default budget; see Budget. It
	// only applies when Retry or Hedge is set.
	Budget Budget

	// ReplayBuffer bounds, in bytes, the copy kept of a request body that
	// has no GetBody (an io.NopCloser, an io.Pipe), so that the request
	// can be retried or hedged like one that has. As the first attempt
	// reads the caller's body, up to ReplayBuffer bytes of it are kept; a
	// body that fits, exactly ReplayBuffer bytes included, is then sent
	// again from the copy, and one that does not is sent once
	// (Observer.RetrySkipped reports SkipNotReplayable with BodyTooLarge).
	// Buffering changes nothing of what may be repeated: a plain POST's
	// body is kept only so that an attempt that never reached the server
	// can be retried (see package transport), never to repeat a POST
	// that did. The caller's request is never modified.
	//
	// Memory is at most one buffer of ReplayBuffer bytes (rounded up to a
	// power of two) per call in flight, pooled up to 64 KiB, and returned
	// when the call is over; a request without a body, or with GetBody,
	// costs nothing. It only applies when Retry or Hedge is set. If zero,
	// DefaultReplayBuffer (64 KiB) is used. If negative, no copy is kept
	// and a body without GetBody is never sent twice.
	ReplayBuffer int

	// Propagate, when true, makes every wire attempt to the set's keys
	// (the first, each retry, each hedge leg) carry what the next service
	// needs to take its part in the call: the call's priority and tenant,
	// the time the attempt may still take, and the attempt's number, in
	// the headers transport.Config names (Resilix-Priority,
	// Resilix-Tenant, Resilix-Timeout-Ms and Resilix-Attempt unless set).
	// Package admission reads them back on the server. A header is
	// written only when there is a value to write, and only on the
	// attempt's own copy of the request, where it replaces what the
	// request carried under that name, and removes it when there is no
	// value; see package transport, "Across services", for what each one
	// carries.
	//
	// It is off by default because a third-party API should not see
	// internal headers: they tell it how the caller ranks its traffic
	// and who its tenants are, and it has no use for them. Internal
	// services turn it on for their keys, in transport.Config.PerKey (or
	// in Policies, for a client that only calls internal services).
	Propagate bool

	Retry     *Retry
	Hedge     *Hedge
	Throttler *Throttler
	Breaker   *Breaker
	Limiter   *Limiter
	Bulkhead  *Bulkhead
	RateLimit *RateLimit
	Timeout   *Timeout

	// Replicas, when set, sends the wire attempts over lanes, connection
	// pools of their own, one per replica of the host or per connection
	// to it, picked by load and latency, with outliers ejected; nil is
	// one pool for every key (the base itself). See Replicas.
	Replicas *Replicas
}

// With returns s changed by changes, field by field: each field of
// changes that is set replaces s's, and each that is not keeps it. Set
// means a non-nil policy, Classify or Replicas; a non-zero Attempts,
// ReplayBuffer or Budget; a true Propagate. A field is replaced whole: a
// policy of changes is not merged with s's, so &Breaker{} in changes is
// the Breaker at its defaults, whatever s's was. Neither s nor changes
// is modified; the result shares the policies it takes from each, which
// is safe, since transport.New copies what it keeps.
//
// It is the way to write a key's set in transport.Config.PerKey as the
// common set plus what differs, so that a policy added to the common set
// later reaches that key too:
//
//	api := base.With(policy.Set{RateLimit: &policy.RateLimit{PerSecond: 50}})
//
// Since a nil field of changes keeps s's, With cannot turn a policy off:
// assign the result's field, which says so where it is read:
//
//	api.Breaker = nil  // no breaker for this key
//	api.Propagate = false
//
// The result is validated like any set (Validate; transport.New validates
// every PerKey entry): a change can make a valid set invalid (Attempts 1
// with s's Retry set, say), and New reports it, naming the field.
func (s Set) With(changes Set) Set {
	s.Attempts = or(changes.Attempts, s.Attempts)
	if changes.Classify != nil {
		s.Classify = changes.Classify
	}
	s.Budget = or(changes.Budget, s.Budget)
	s.ReplayBuffer = or(changes.ReplayBuffer, s.ReplayBuffer)
	s.Propagate = s.Propagate || changes.Propagate
	s.Retry = or(changes.Retry, s.Retry)
	s.Hedge = or(changes.Hedge, s.Hedge)
	s.Throttler = or(changes.Throttler, s.Throttler)
	s.Breaker = or(changes.Breaker, s.Breaker)
	s.Limiter = or(changes.Limiter, s.Limiter)
	s.Bulkhead = or(changes.Bulkhead, s.Bulkhead)
	s.RateLimit = or(changes.RateLimit, s.RateLimit)
	s.Timeout = or(changes.Timeout, s.Timeout)
	s.Replicas = or(changes.Replicas, s.Replicas)
	return s
}

// DefaultReplayBuffer is the ReplayBuffer used when the field is zero.
const DefaultReplayBuffer = 64 << 10

// ReplayBytes returns the bound on the copy of a body without GetBody:
// ReplayBuffer with its default applied, or -1 when it is off.
func (s *Set) ReplayBytes() int {
	switch {
	case s.ReplayBuffer < 0:
		return -1
	case s.ReplayBuffer == 0:
		return DefaultReplayBuffer
	}
	return s.ReplayBuffer
}

// Amplifies reports whether the set may send more than one wire call per
// logical call.
func (s *Set) Amplifies() bool { return s.Retry != nil || s.Hedge != nil }

// MaxAttempts returns Attempts with its default applied.
func (s *Set) MaxAttempts() int {
	switch {
	case s.Attempts > 0:
		return s.Attempts
	case s.Amplifies():
		return 3
	}
	return 1
}

// Validate reports every invalid field of the set, naming it, as in
// "policy: RateLimit.PerSecond must be > 0, got 0": one error per rule
// broken, joined with errors.Join (one per line of the message), so no
// field hides another. transport.New calls it; a Set that passes it never
// makes the transport panic.
func (s *Set) Validate() error {
	return joinErrs(
		fieldErrIf(s.Attempts < 0, "Attempts", "must be >= 0, got %d", s.Attempts),
		fieldErrIf(s.Attempts > 1 && !s.Amplifies(),
			"Attempts", "is %d but neither Retry nor Hedge is set, so only one wire call would ever be made", s.Attempts),
		s.validateAmplifiers(),
		s.Budget.validate(),
		validateIf(s.Retry),
		validateIf(s.Hedge),
		validateIf(s.Throttler),
		validateIf(s.Breaker),
		validateIf(s.Limiter),
		validateIf(s.Bulkhead),
		validateIf(s.RateLimit),
		validateIf(s.Timeout),
		validateIf(s.Replicas),
	)
}

// validateAmplifiers reports the Retry and Hedge that Attempts leaves
// nothing to do: with Attempts 1 neither can send a second call, and legs
// beyond Attempts are never in flight.
func (s *Set) validateAmplifiers() error {
	var errs []error
	if s.Attempts == 1 && s.Amplifies() {
		set, verb := "Retry and Hedge are", "retried or hedged"
		switch {
		case s.Hedge == nil:
			set, verb = "Retry is", "retried"
		case s.Retry == nil:
			set, verb = "Hedge is", "hedged"
		}
		errs = append(errs, fieldErr("Attempts", "is 1 but %s set: Attempts counts the first call, so none would ever be %s", set, verb))
	}
	if h := s.Hedge; h != nil && (s.Attempts == 0 || s.Attempts > 1) && h.MaxConcurrent > s.MaxAttempts() {
		attempts := fmt.Sprint(s.Attempts)
		if s.Attempts == 0 {
			attempts = fmt.Sprintf("%d, the default with Retry or Hedge set", s.MaxAttempts())
		}
		errs = append(errs, fieldErr("Hedge.MaxConcurrent", "(%d) must be <= Attempts (%s): a call never has more legs than Attempts", h.MaxConcurrent, attempts))
	}
	return joinErrs(errs...)
}

type validator interface{ validate() error }

// validateIf validates p unless it is a nil pointer.
func validateIf[T any, P interface {
	*T
	validator
}](p P) error {
	if p == nil {
		return nil
	}
	return p.validate()
}

func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("policy: %s "+format, append([]any{field}, args...)...)
}

// fieldErrIf is fieldErr when bad, and nil otherwise.
func fieldErrIf(bad bool, field, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fieldErr(field, format, args...)
}

// joinErrs is errors.Join, flattened: the errors of a joined error are joined
// one by one, so that each error of the result is one rule broken, one line
// of the message. Nil errors are dropped; join of none is nil.
func joinErrs(errs ...error) error {
	var flat []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			flat = append(flat, j.Unwrap()...)
		} else if err != nil {
			flat = append(flat, err)
		}
	}
	return errors.Join(flat...)
}

// or returns v, or def when v is zero.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
