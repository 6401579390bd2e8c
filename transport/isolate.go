package transport

import (
	"context"
	"fmt"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
)

// Isolate refuses every call to key, from now until Release, with a
// *policy.RejectedError matching both policy.ErrIsolated and
// policy.ErrCircuitOpen; see "Isolating a key" in the package doc for
// when to, and what callers see.
//
// key is as Measured takes it: with the default Config.Key, a host[:port]
// canonicalized as a Config.PerKey entry is ("API.example.com:443" is
// "api.example.com"), and anything else (a URL, a path, an empty string)
// is an error; with a Key func, that func's key as it is. The key need not
// have been called yet, and need not run a Breaker: its first call is
// refused all the same, and a key without a Breaker gets one that only
// Isolate and Release move (its snapshot then has HasBreaker, with a zero
// ErrorRate and TripPoint).
//
// An isolated key's state is never forgotten under Config.MaxKeys, and
// counts against it like any other key's; at most MaxKeys keys can be
// isolated at once, and Isolate returns an error beyond. Isolating a key
// that is isolated already does nothing. Isolate is safe for concurrent
// use, with calls to the key in flight too.
//
// The names say what the operator does, in an incident's words: a
// dependency is isolated, then released (Polly's pair is Isolate and
// Close, which would read here as closing the Transport). ResetBreaker
// names what it resets, the breaker alone; it is no inverse of Isolate.
func (t *Transport) Isolate(key string) error {
	k, err := t.operatorKey("Isolate", key)
	if err != nil {
		return err
	}
	s, ch, err := t.scopes.isolate(k, time.Now())
	if err != nil {
		return fmt.Errorf("transport: Isolate(%q): %w", key, err)
	}
	t.handMoved(s, ch)
	return nil
}

// Release ends the isolation of key (see Isolate for how key is read): its
// breaker closes with an empty window, keeping its baseline, and judges
// the key by its own rules again. A key that is not isolated is left as it
// is, and Release returns nil.
func (t *Transport) Release(key string) error {
	k, err := t.operatorKey("Release", key)
	if err != nil {
		return err
	}
	s, ch := t.scopes.release(k, time.Now())
	t.handMoved(s, ch)
	return nil
}

// ResetBreaker closes key's breaker now if it is open or half-open (see
// Isolate for how key is read): with an empty window, its baseline kept,
// as a successful probe would. Calls admitted before it finish and count
// for nothing. A closed breaker is left as it is, window and all, and so
// is a key with no state or no Breaker. An isolated key stays isolated and
// ResetBreaker returns an error: Release ends an isolation.
func (t *Transport) ResetBreaker(key string) error {
	k, err := t.operatorKey("ResetBreaker", key)
	if err != nil {
		return err
	}
	s := t.scopes.lookup(k)
	if s == nil {
		return nil
	}
	b := s.breakerOf()
	if b.Isolated() {
		return fmt.Errorf("transport: ResetBreaker(%q): the key is isolated; Release ends an isolation", key)
	}
	t.handMoved(s, b.Reset(time.Now()))
	return nil
}

// operatorKey returns the key an operator's method names, canonicalized
// as a PerKey entry is under the default Key.
func (t *Transport) operatorKey(method, key string) (string, error) {
	if !t.hostKeys {
		return key, nil
	}
	k, err := perKeyName(key)
	if err != nil {
		return "", fmt.Errorf("transport: %s(%q): %w", method, key, err)
	}
	return k, nil
}

// handMoved reports a change an operator's method made, with no lock
// held, under context.Background(): no call made it.
func (t *Transport) handMoved(s *scope, ch gate.BreakerChange) {
	if !ch.Changed() {
		return
	}
	if o := t.obs; o != nil && o.BreakerTransition != nil {
		o.BreakerTransition(policy.BreakerTransition{Context: context.Background(), Key: s.key, From: ch.From, To: ch.To})
	}
}
