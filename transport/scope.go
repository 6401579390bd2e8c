package transport

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/hedge"
	"github.com/resilix/resilix/policy"
)

// compiledSet is a validated policy.Set with its defaults applied: what every
// scope of a key shares, read-only. It holds copies, never a pointer into
// the caller's Set.
type compiledSet struct {
	attempts  int
	classify  policy.Classify
	retry     *policy.Retry // nil: off
	hedge     *policy.Hedge
	throttler *policy.Throttler
	limiter   *policy.Limiter
	breaker   *policy.Breaker
	bulkhead  *policy.Bulkhead
	rateLimit *policy.RateLimit
	timeout   time.Duration // 0: off
	idle      time.Duration // Timeout.Idle; 0: off
	replay    int           // ReplayBuffer with its default; -1: off
	budget    policy.Budget // used when amplifying
	// timed is true when a policy learns from attempt latency or outcome
	// times; otherwise the clock is not read around the wire call.
	timed bool
	// dateBySend is true when the breaker is the only policy that needs
	// the time of an answer, and the per-attempt timeout bounds an attempt
	// to a slice of its window: a success is then dated by when its
	// attempt was sent, which lands it in its own slice or the one before
	// (see estimator.Slice), and the clock is not read at headers. Any
	// other outcome, which may trip the breaker, reads it.
	dateBySend bool
	// propagate is Set.Propagate: the wire attempts carry the call's
	// priority, tenant, time left and attempt number (see stamp).
	propagate bool
	replicas  *policy.Replicas // nil: every attempt goes to the base
}

func compile(s policy.Set) (*compiledSet, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	// Every policy is copied with its defaults applied, here and only
	// here: scopes are built lazily from the compiled set, so a pointer into s
	// would let an edit after New reach them unvalidated, and the runtime
	// constructors take their configs as they are.
	c := &compiledSet{
		attempts:  s.MaxAttempts(),
		replay:    s.ReplayBytes(),
		classify:  s.Classify,
		budget:    s.Budget.WithDefaults(),
		retry:     defaulted(s.Retry, policy.Retry.WithDefaults),
		hedge:     defaulted(s.Hedge, policy.Hedge.WithDefaults),
		throttler: defaulted(s.Throttler, policy.Throttler.WithDefaults),
		breaker:   defaulted(s.Breaker, policy.Breaker.WithDefaults),
		limiter:   defaulted(s.Limiter, policy.Limiter.WithDefaults),
		bulkhead:  defaulted(s.Bulkhead, func(b policy.Bulkhead) policy.Bulkhead { return b }),
		rateLimit: defaulted(s.RateLimit, policy.RateLimit.WithDefaults),
		propagate: s.Propagate,
		replicas:  defaulted(s.Replicas, policy.Replicas.WithDefaults),
	}
	if c.classify == nil {
		c.classify = policy.DefaultClassify
	}
	if c.throttler != nil {
		c.throttler.MaxPushback = s.Throttler.PushbackBound(s.Retry) // resolved against the Set's Retry
	}
	if s.Timeout != nil {
		c.timeout = s.Timeout.WithDefaults().PerAttempt
		c.idle = s.Timeout.Idle
	}
	c.timed = c.hedge != nil || c.breaker != nil || c.throttler != nil || c.limiter != nil
	c.dateBySend = c.breaker != nil && c.hedge == nil && c.throttler == nil && c.limiter == nil &&
		c.timeout > 0 && c.timeout <= estimator.Slice(c.breaker.Window)
	return c, nil
}

// defaulted returns a copy of *p with its defaults applied, or nil when p
// is nil: the policy is off.
func defaulted[T any](p *T, withDefaults func(T) T) *T {
	if p == nil {
		return nil
	}
	v := withDefaults(*p)
	return &v
}

// scope is the state of one key: everything its calls share. A nil field
// is a policy that is off.
type scope struct {
	key      string
	set      *compiledSet
	budget   *gate.Budget
	throttle *gate.Throttler
	breaker  *gate.Breaker
	// manual is the breaker of a key with no Breaker configured, made by
	// the first Isolate of the key and kept for the life of the scope;
	// nil before, and always for a key with a Breaker.
	manual   atomic.Pointer[gate.Breaker]
	limiter  *gate.Limiter
	bulkhead *gate.Bulkhead
	rate     *gate.RateLimiter
	hedge    *hedge.State
	lanes    *lanes // nil: Replicas is off

	lastUsed  atomic.Int64 // UnixNano of the last call, for eviction
	calls     atomic.Int64 // RoundTrips between registry.enter and leave
	malformed atomic.Uint64
	repeats   atomic.Uint64 // calls sent once for a request that was a repeat (see call.narrow)
}

// leave ends a call that registry.enter counted.
func (s *scope) leave() { s.calls.Add(-1) }

// breakerOf returns the key's breaker: the configured one, else the one
// Isolate made, else nil.
func (s *scope) breakerOf() *gate.Breaker {
	if s.breaker != nil {
		return s.breaker
	}
	return s.manual.Load()
}

// The eviction ranks of a scope, from first to go to never.
const (
	rankQuiet   = iota // nothing in flight, breaker closed (or none)
	rankTripped        // nothing in flight, breaker open or half-open
	rankHeld           // calls in flight, or isolated: never evicted
)

// rank returns the scope's eviction rank at now. A scope has calls in
// flight while a RoundTrip on it has not returned, and while its gates
// hold anything for an attempt: a bulkhead slot (held until the response
// body is closed or read to its end), a limiter permit or queue place (a
// hedge leg outliving its call's return). A response body without a
// bulkhead slot holds nothing of the scope's. An isolated scope is held
// until it is released: forgetting it would end the isolation.
func (s *scope) rank(now time.Time) int {
	switch {
	case s.calls.Load() > 0, s.bulkhead.InFlight() > 0, s.limiter.InFlight() > 0, s.limiter.Queued() > 0:
		return rankHeld
	}
	switch s.breakerOf().State(now) {
	case policy.BreakerClosed:
		return rankQuiet
	case policy.BreakerIsolated:
		return rankHeld
	}
	return rankTripped
}

// snapshot reads the scope's state at now. It allocates nothing: an
// observer reads every scope's on each collection.
func (s *scope) snapshot(now time.Time) policy.Snapshot {
	m := policy.Snapshot{
		Known:            true,
		MalformedHeaders: s.malformed.Load(),
		RepeatsSentOnce:  s.repeats.Load(),
	}
	if s.hedge != nil {
		m.HasHedge = true
		if d, ok := s.hedge.Threshold(now); ok {
			m.HedgeThreshold = d
		}
		m.HedgesStarted, m.HedgesWon = s.hedge.Wins(now)
		m.HedgeAllowance = s.hedge.Allowance(now)
	}
	if s.budget != nil {
		m.HasBudget = true
		m.BudgetBalance = s.budget.Balance(now)
	}
	if s.throttle != nil {
		m.HasThrottler = true
		m.Pressure = s.throttle.Pressure(now)
		h := s.throttle.Hold(now)
		m.PushbackLeft, m.PushbackStopped, m.PushbackRate = h.Left, h.Stopped, h.Rate
	}
	if b := s.breakerOf(); b != nil {
		m.HasBreaker = true
		m.BreakerState = b.State(now)
		r := b.Rate(now)
		m.ErrorRate, m.TripPoint = r.ErrorRate, r.TripPoint
	}
	if s.limiter != nil {
		m.HasLimiter = true
		m.LimiterLimit = s.limiter.Limit()
		m.LimiterInFlight = s.limiter.InFlight()
		m.LimiterQueued = s.limiter.Queued()
		m.Pressure = max(m.Pressure, s.limiter.Pressure())
	}
	if s.bulkhead != nil {
		m.HasBulkhead = true
		m.BulkheadInFlight = s.bulkhead.InFlight()
	}
	m.HasRateLimit = s.rate != nil
	m.RateLimitStore, m.RateLimitLeased = s.rate.Store(now)
	if s.lanes != nil {
		m.HasReplicas = true
		c := s.lanes.Counts(now)
		m.Lanes, m.LanesEjected, m.LanesIgnored = c.Lanes, c.Ejected, c.Ignored
		s.lanes.States(now, &m.PerLane)
	}
	return m
}

// registry maps keys to scopes. Lookups take a read lock; only a new key
// takes the write lock. No goroutine or timer runs for it.
//
// It holds at most max scopes, except that a scope with calls in flight
// or isolated (see scope.rank) is never evicted: a new key that finds every
// held scope busy is let in beyond max, so that the registry holds at most
// max plus the calls in flight at the peak, and the next new key once they
// are done sheds the excess. At most max scopes are isolated at once.
type registry struct {
	mu       sync.RWMutex
	m        map[string]*scope
	max      int
	isolated int // scopes whose breaker is isolated; changed under mu
	create   func(key string, now time.Time) *scope
}

func (r *registry) init(max int, create func(string, time.Time) *scope) {
	r.m = make(map[string]*scope)
	r.max = max
	r.create = create
}

// lookup returns key's scope, or nil.
func (r *registry) lookup(key string) *scope {
	r.mu.RLock()
	s := r.m[key]
	r.mu.RUnlock()
	return s
}

// enter returns key's scope, creating it if needed, with one more call
// counted in it; the caller must call the scope's leave exactly once. When
// the key exists, that is one map lookup under the read lock and two
// atomic writes.
func (r *registry) enter(key string, now time.Time) *scope {
	r.mu.RLock()
	s := r.m[key]
	if s != nil {
		// Counted under the lock, so that eviction, under the write
		// lock, sees every call that has found the scope.
		s.calls.Add(1)
	}
	r.mu.RUnlock()
	if s != nil {
		s.lastUsed.Store(now.UnixNano())
		return s
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.m[key]; s != nil {
		s.calls.Add(1)
		s.lastUsed.Store(now.UnixNano())
		return s
	}
	s = r.createLocked(key, now)
	s.calls.Add(1)
	return s
}

// createLocked makes key's scope, evicting one first if the registry is
// full. r.mu is held for writing, and key has no scope.
func (r *registry) createLocked(key string, now time.Time) *scope {
	if len(r.m) >= r.max {
		r.evictLocked(now, len(r.m)-r.max+1)
	}
	// The key is kept for the life of the scope: a copy, since it is
	// often a substring of a request's URL, which it would keep alive.
	key = strings.Clone(key)
	s := r.create(key, now)
	r.m[key] = s
	return s
}

// isolate isolates key's breaker at now, creating the scope, and a manual
// breaker for a key without a Breaker, if needed. It returns the scope and
// the change to report, none when the key was isolated already, or
// errTooManyIsolated when max keys are.
func (r *registry) isolate(key string, now time.Time) (*scope, gate.BreakerChange, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.m[key]
	if s != nil && s.breakerOf().Isolated() {
		return s, gate.BreakerChange{}, nil
	}
	if r.isolated >= r.max {
		return nil, gate.BreakerChange{}, errTooManyIsolated
	}
	if s == nil {
		s = r.createLocked(key, now)
	}
	b := s.breakerOf()
	if b == nil {
		b = gate.NewManualBreaker()
		s.manual.Store(b)
	}
	ch := b.Isolate(now)
	r.isolated++ // under r.mu, as is every isolation and release
	return s, ch, nil
}

// release ends the isolation of key's breaker at now, and returns the
// scope and the change to report: none, and perhaps no scope, when the key
// was not isolated.
func (r *registry) release(key string, now time.Time) (*scope, gate.BreakerChange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.m[key]
	if s == nil {
		return nil, gate.BreakerChange{}
	}
	ch := s.breakerOf().Release(now)
	if ch.Changed() {
		r.isolated--
	}
	return s, ch
}

// evictSample is how many scopes eviction compares first. Go's map
// iteration starts at a random position, so these are a cheap random
// sample, and the least recently used of them approximates the least
// recently used overall (Redis evicts the same way).
const evictSample = 8

// evictLocked forgets up to n scopes at now, never one with calls in
// flight, and never a tripped one while a quiet one is left: the lowest
// rank first, the least recently used first within a rank. One eviction
// usually finds a quiet scope in a sample; otherwise, and when the
// registry has grown beyond max, every scope is ranked.
func (r *registry) evictLocked(now time.Time, n int) {
	if n == 1 {
		var (
			victim string
			oldest int64
			found  bool
			seen   int
		)
		for k, s := range r.m {
			if lu := s.lastUsed.Load(); (!found || lu < oldest) && s.rank(now) == rankQuiet {
				victim, oldest, found = k, lu, true
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if found {
			r.dropLocked(victim)
			return
		}
	}
	type candidate struct {
		key      string
		rank     int
		lastUsed int64
	}
	var cands []candidate
	for k, s := range r.m {
		if rk := s.rank(now); rk != rankHeld {
			cands = append(cands, candidate{k, rk, s.lastUsed.Load()})
		}
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.lastUsed, b.lastUsed)
	})
	for _, c := range cands[:min(n, len(cands))] {
		r.dropLocked(c.key)
	}
}

// dropLocked forgets key's scope, and lets its lanes' connections go
// (attempts still in flight on them finish, and each connection closes
// once its last stream ends). r.mu is held.
func (r *registry) dropLocked(key string) {
	r.m[key].forgetLanes()
	delete(r.m, key)
}

// len returns the number of scopes held.
func (r *registry) len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// each calls f for every scope, with no lock held while f runs.
func (r *registry) each(f func(*scope)) {
	r.mu.RLock()
	all := make([]*scope, 0, len(r.m))
	for _, s := range r.m {
		all = append(all, s)
	}
	r.mu.RUnlock()
	for _, s := range all {
		f(s)
	}
}

// resolve asks key s's Endpoints for the addresses of hostport, makes the
// answer its lanes, and tells obs of the change; it runs on a goroutine
// of its own, started by the call that found a refresh due.
func (s *scope) resolve(obs *policy.Observer, hostport string) {
	r := s.set.replicas
	ctx, cancel := context.WithTimeout(context.Background(), r.Refresh)
	addrs, err := r.Endpoints.Resolve(ctx, hostport)
	cancel()
	c := s.lanes.Update(time.Now(), addrs, err)
	for _, l := range c.Drained {
		l.Pool.CloseIdleConnections()
	}
	if obs != nil && obs.LanesChanged != nil && len(c.Added)+len(c.Removed) > 0 {
		obs.LanesChanged(policy.LaneSetChange{
			Context: context.Background(), Key: s.key, Added: c.Added, Removed: c.Removed, Lanes: c.Lanes,
		})
	}
}

// closeLanes closes the idle connections of every lane of s.
func (s *scope) closeLanes() {
	if s.lanes != nil {
		s.lanes.Pools((*lanePool).closeIdle)
	}
}

// forgetLanes lets the connections of every lane of s go, s being
// forgotten: each closes once its last stream ends.
func (s *scope) forgetLanes() {
	if s.lanes != nil {
		s.lanes.Pools((*lanePool).forget)
	}
}

// errTooManyIsolated is Isolate's error when Config.MaxKeys keys are
// isolated already.
var errTooManyIsolated = errors.New("as many keys as MaxKeys are isolated already")
