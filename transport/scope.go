package transport

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

// chain is a validated policy.Set with its defaults applied: what every
// scope of a key shares, read-only. It holds copies, never a pointer into
// the caller's Set.
type chain struct {
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
	budget    policy.Budget // used when amplifying
	// timed is true when a policy learns from attempt latency or outcome
	// times; otherwise the clock is not read around the wire call.
	timed bool
}

func compile(s policy.Set) (*chain, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	// Every policy is copied: scopes are built lazily from the chain, so
	// a pointer into s would let an edit after New reach them unvalidated.
	c := &chain{
		attempts: s.MaxAttempts(),
		classify: s.Classify,
		budget:   s.Budget,
	}
	if c.classify == nil {
		c.classify = policy.DefaultClassify
	}
	if s.Retry != nil {
		r := s.Retry.WithDefaults()
		c.retry = &r
	}
	if s.Hedge != nil {
		h := s.Hedge.WithDefaults()
		c.hedge = &h
	}
	if s.Breaker != nil {
		b := s.Breaker.WithDefaults()
		c.breaker = &b
	}
	if s.Throttler != nil {
		th := s.Throttler.WithDefaults()
		c.throttler = &th
	}
	if s.Limiter != nil {
		l := s.Limiter.WithDefaults()
		c.limiter = &l
	}
	if s.Bulkhead != nil {
		b := *s.Bulkhead
		c.bulkhead = &b
	}
	if s.RateLimit != nil {
		r := s.RateLimit.WithDefaults()
		c.rateLimit = &r
	}
	if s.Timeout != nil {
		c.timeout = s.Timeout.WithDefaults().PerAttempt
	}
	c.timed = c.hedge != nil || c.breaker != nil || c.throttler != nil || c.limiter != nil
	return c, nil
}

// scope is the state of one key: everything its calls share. A nil field
// is a policy that is off.
type scope struct {
	key      string
	chain    *chain
	budget   *policy.BudgetBucket
	throttle *policy.AdaptiveThrottler
	breaker  *policy.CircuitBreaker
	limiter  *policy.AdaptiveLimiter
	bulkhead *policy.BulkheadGate
	rate     *policy.RateLimiter
	hedge    *policy.HedgeState

	lastUsed  atomic.Int64 // UnixNano of the last call, for eviction
	malformed atomic.Uint64
}

func (t *Transport) newScope(key string, now time.Time) *scope {
	c := t.def
	if pk, ok := t.perKey[key]; ok {
		c = pk
	}
	s := &scope{key: key, chain: c}
	if c.retry != nil || c.hedge != nil {
		s.budget = policy.NewBudgetBucket(c.budget, now)
	}
	if c.hedge != nil {
		s.hedge = policy.NewHedgeState(*c.hedge, now)
	}
	if c.breaker != nil {
		s.breaker = policy.NewCircuitBreaker(*c.breaker, now, rand.Uint64())
	}
	if c.throttler != nil {
		s.throttle = policy.NewAdaptiveThrottler(*c.throttler, now, rand.Uint64())
	}
	if c.limiter != nil {
		s.limiter = policy.NewAdaptiveLimiter(*c.limiter, now)
	}
	if c.bulkhead != nil {
		s.bulkhead = policy.NewBulkheadGate(*c.bulkhead)
	}
	if c.rateLimit != nil {
		s.rate = policy.NewRateLimiter(*c.rateLimit)
	}
	s.lastUsed.Store(now.UnixNano())
	return s
}

func (s *scope) measured(now time.Time) Measured {
	m := Measured{
		Known:            true,
		MalformedHeaders: s.malformed.Load(),
	}
	if s.budget != nil {
		m.Budgeted = true
		m.BudgetBalance = s.budget.Balance(now)
	}
	if s.hedge != nil {
		if d, ok := s.hedge.Threshold(now); ok {
			m.HedgeThreshold = d
		}
		m.HedgesStarted, m.HedgesWon = s.hedge.WinRate(now)
		m.HedgeAllowance = s.hedge.Allowance(now)
	}
	if s.breaker != nil {
		m.BreakerState = s.breaker.State(now)
		r := s.breaker.Rate(now)
		m.ErrorRate, m.TripPoint = r.ErrorRate, r.TripPoint
	}
	if s.bulkhead != nil {
		m.BulkheadInFlight = s.bulkhead.InFlight()
	}
	if s.limiter != nil {
		m.LimiterLimit = s.limiter.Limit()
		m.LimiterInFlight = s.limiter.InFlight()
		m.LimiterQueued = s.limiter.Queued()
		m.Pressure = s.limiter.Pressure()
	}
	if s.throttle != nil {
		m.Pressure = max(m.Pressure, s.throttle.Pressure(now))
	}
	return m
}

func (s *scope) state(now time.Time) policy.State {
	var st policy.State
	if s.breaker != nil {
		st.HasBreaker, st.BreakerState = true, s.breaker.State(now)
	}
	if s.budget != nil {
		st.Budgeted, st.BudgetBalance = true, s.budget.Balance(now)
	}
	if s.limiter != nil {
		st.HasLimiter, st.LimiterLimit = true, s.limiter.Limit()
	}
	if s.hedge != nil {
		if d, ok := s.hedge.Threshold(now); ok {
			st.HedgeThreshold = d
		}
	}
	return st
}

// registry maps keys to scopes, bounded by max. Lookups take a read lock;
// only a new key takes the write lock. No goroutine or timer runs for it.
type registry struct {
	mu     sync.RWMutex
	m      map[string]*scope
	max    int
	create func(key string, now time.Time) *scope
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

// get returns key's scope, creating it if needed: one map lookup when it
// exists.
func (r *registry) get(key string, now time.Time) *scope {
	if s := r.lookup(key); s != nil {
		s.lastUsed.Store(now.UnixNano())
		return s
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.m[key]; s != nil {
		return s
	}
	if len(r.m) >= r.max {
		r.evictLocked()
	}
	// The key is kept for the life of the scope: a copy, since it is
	// often a substring of a request's URL, which it would keep alive.
	key = strings.Clone(key)
	s := r.create(key, now)
	r.m[key] = s
	return s
}

// evictSample is how many scopes eviction compares. Go's map iteration
// starts at a random position, so these are a cheap random sample, and the
// least recently used of them approximates the least recently used overall
// (Redis evicts the same way).
const evictSample = 8

// evictLocked forgets the least recently used scope of a sample. Calls in
// flight on it finish normally against state nobody else will see.
func (r *registry) evictLocked() {
	var (
		victim string
		oldest int64
		n      int
	)
	for k, s := range r.m {
		if lu := s.lastUsed.Load(); n == 0 || lu < oldest {
			victim, oldest = k, lu
		}
		if n++; n == evictSample {
			break
		}
	}
	delete(r.m, victim)
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
