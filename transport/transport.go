package transport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"weak"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/hedge"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/policy"
)

// Config configures a Transport. The zero Config is valid: it forwards to a
// pooled cleanhttp transport with no policy on, and is then a plain
// RoundTripper with per-host bookkeeping.
type Config struct {
	// Base sends the wire attempts. If nil,
	// cleanhttp.DefaultPooledTransport() is used. A nil pointer or func
	// of a RoundTripper type (an unset *http.Transport variable) is not
	// nil here, and makes New fail, naming its type.
	Base http.RoundTripper

	// Policies is the chain applied to every key without an entry in
	// PerKey.
	Policies policy.Set

	// PerKey replaces Policies for the keys it names (whole sets, not
	// merged field by field). Every entry is validated by New. Write an
	// entry as Policies.With(changes) (policy.Set.With) to keep the
	// fields of Policies it does not change.
	//
	// With the default Key, an entry names a host as a URL's authority
	// does, host[:port], and New canonicalizes it as the default Key does
	// a request's: "API.example.com." names "api.example.com". PerKey has
	// no scheme, so a port 80 or 443 is dropped whatever the scheme:
	// "api.example.com:443" and "api.example.com:80" both name
	// "api.example.com", which is the key of http:// and https:// requests
	// to the host on their default ports (and a request on the other
	// scheme's default port, https://h:80/, has the key "h:80", which no
	// entry can name; a Key func can). An entry that is not a host[:port]
	// ("https://api.example.com", a path, an empty string, a port out of
	// range), or two entries that name one key ("h" and "H:443"), make
	// New fail, naming them.
	//
	// With a Key func, entries are that func's keys, used as they are.
	PerKey map[string]policy.Set

	// Key maps a request to the key whose state it shares: breaker,
	// budget, latency window, limits. Its result is used as is (and
	// copied when a key's state is created). If nil, the request's
	// canonical authority is used, so that each upstream is isolated from
	// the others however its URLs spell it: req.URL.Host with the host in
	// lower case and without a trailing dot, and the port dropped when it
	// is the scheme's default (80 for http and ws, 443 for https and wss).
	// "http://API.example.com.:80/x" and "https://api.example.com/y" both
	// have the key "api.example.com"; "http://[::1]:8080/" has "[::1]:8080".
	// Key is never called for a request without a URL.
	//
	// "" is a key like any other: a Key func that returns "" for the
	// requests it does not recognize puts all of them, whatever their
	// hosts, in the one key "", with one breaker, budget, latency window
	// and limits between them (one failing host opens the breaker for
	// all), under PerKey[""] if there is one and Policies if not, and
	// reported to the Observer with Key "". Nothing warns of it: to keep
	// unknown hosts apart, return their canonical authority instead of "".
	Key func(*http.Request) string

	// MaxKeys bounds the number of keys whose state is kept, so that
	// memory stays bounded whatever hosts requests name. If zero, 1024 is
	// used.
	//
	// When a new key arrives and the bound is reached, a key is forgotten:
	// a quiet one, the least recently used (approximately: the oldest of a
	// small sample, or of all keys when the sample holds no quiet one).
	// A key whose breaker is open or half-open is forgotten only when no
	// quiet key is left, so that traffic does not flow to a dead host
	// again because other hosts were called. A key with calls in flight
	// is never forgotten: a call is in flight from the start of RoundTrip
	// until it returns, and after that while it holds a bulkhead slot
	// (until its response body is closed or read to the end) or a limiter
	// permit (a hedge leg still running). Nor is an isolated key (see
	// Transport.Isolate), until it is released; at most MaxKeys keys are
	// isolated at once. A new key that finds every key
	// busy is kept beyond MaxKeys, so at most MaxKeys plus the calls in
	// flight are held, and the first new key after they are done brings
	// the count back to MaxKeys.
	MaxKeys int

	// Observer receives events about calls, attempts and refusals. If
	// nil, nothing is reported and nothing is paid.
	Observer *policy.Observer

	// PriorityHeader is the request header a priority is read from when
	// the context carries none (shedding.WithPriority wins), and written
	// to on the wire attempts of keys whose set has Propagate on. If
	// empty, "Resilix-Priority" is used. An unparsable value is
	// tolerated: the call goes on as Critical and the header is reported
	// to Observer.MalformedHeader and counted in Measured.
	PriorityHeader string

	// TenantHeader is the request header a tenant id is read from when the
	// context carries none (tenant.With wins), and written to on the wire
	// attempts of keys whose set has Propagate on. If empty,
	// "Resilix-Tenant" is used. An id longer than MaxTenantLen bytes, or
	// one that is not a valid header value, is not written: it is
	// reported to Observer.MalformedHeader (with at most its first 64
	// bytes) and counted in Measured, once a call.
	TenantHeader string

	// DistrustHeaders, when true, makes the transport take a call's
	// priority and tenant from its context alone (shedding.WithPriority,
	// tenant.With), never from the request's PriorityHeader and
	// TenantHeader: a call whose context names neither is Critical with
	// no tenant, whatever its headers say, and with Propagate on those
	// headers are removed from its wire attempts. Set it on a transport
	// that sends requests it did not build, a reverse proxy's that copies
	// its callers' headers, where an outsider's header would otherwise
	// name the tenant a rate limit or limiter sheds by, or the priority.
	//
	// It is false by default, unlike the server side (package admission
	// trusts no caller's headers unless Config.Trust says so): a client's
	// requests are built by the service's own code, inside its trust
	// boundary, where tagging by header is a documented way to tag, and
	// turning it off by default would make every such call Critical and
	// tenantless without an error. A server built with package admission
	// already overrides both in the context it hands its handler, so a
	// transport inside that handler, sending requests with that context,
	// reads no outsider's headers either way.
	DistrustHeaders bool

	// TimeoutHeader is the request header that tells the upstream, on the
	// wire attempts of keys whose set has Propagate on, how long the
	// attempt may still take, in whole milliseconds. If empty,
	// "Resilix-Timeout-Ms" is used.
	TimeoutHeader string

	// AttemptHeader is the request header that tells the upstream, on the
	// wire attempts of keys whose set has Propagate on, which of the
	// call's wire attempts this is: 1 for the first, 2 and up for each
	// retry and hedge leg. If empty, "Resilix-Attempt" is used.
	AttemptHeader string
}

// DefaultMaxKeys is the MaxKeys used when the field is zero.
const DefaultMaxKeys = 1024

// MaxTenantLen is the longest tenant id, in bytes, that a key with
// Propagate on writes on its wire attempts: room for any id a service
// names its tenants by (a UUID is 36 bytes, a DNS name at most 253), none
// for a header that is a payload. A longer id, from the context or the
// request's header, is not written, and is reported as a malformed
// TenantHeader (see Config.TenantHeader).
const MaxTenantLen = 256

// Transport is an http.RoundTripper that applies resilix's policies to each
// request. Build one with New; it is safe for concurrent use, and meant to
// be shared for the life of the process like http.DefaultTransport.
type Transport struct {
	base           http.RoundTripper
	connTrace      bool // base is an *http.Transport: it calls GotConn on the request's goroutine before writing it
	streamTrace    bool // and its HTTP/2 may hold a request on the connection it got, for a stream (StrictMaxConcurrentRequests)
	key            func(*http.Request) string
	hostKeys       bool // Key is the default: keys are canonical authorities
	obs            *policy.Observer
	priorityHeader string
	tenantHeader   string
	distrust       bool // Config.DistrustHeaders
	timeoutHeader  string
	attemptHeader  string
	def            *compiledSet
	perKey         map[string]*compiledSet
	scopes         registry
	watchdogs      atomic.Int64 // idle watchdogs armed on response bodies, not yet stopped
	let            letGo        // lanes' pools let go with streams still open
}

// New validates cfg and returns a Transport. Every invalid field is
// reported in the returned error, one per line (an errors.Join), each
// naming the field and, for a policy's, the set it is in:
//
//	transport: Policies: policy: Hedge.Quantile must be in (0, 1), got 1.5
//	transport: PerKey["b:80"]: policy: Timeout.PerAttempt must be >= 0, got -1ns
//
// No field hides another, and New never corrects a value silently. New
// copies what it keeps, the policies, the PerKey map and the Observer:
// editing any of them afterwards changes nothing.
func New(cfg Config) (*Transport, error) {
	var errs []error
	if cfg.MaxKeys < 0 {
		errs = append(errs, fmt.Errorf("transport: MaxKeys must be >= 0, got %d", cfg.MaxKeys))
	}
	headers, herrs := httpx.Headers{cfg.PriorityHeader, cfg.TenantHeader, cfg.TimeoutHeader, cfg.AttemptHeader}.Canonical("transport")
	errs = append(errs, herrs...)
	ph, th, toh, ah := headers[0], headers[1], headers[2], headers[3]
	def, err := compile(cfg.Policies)
	errs = append(errs, prefixed("transport: Policies", err)...)
	var perKey map[string]*compiledSet
	if len(cfg.PerKey) > 0 {
		perKey = make(map[string]*compiledSet, len(cfg.PerKey))
		named := make(map[string]string, len(cfg.PerKey)) // key → the entry naming it
		for _, k := range slices.Sorted(maps.Keys(cfg.PerKey)) {
			key, where := k, fmt.Sprintf("transport: PerKey[%q]", k)
			if cfg.Key == nil {
				if key, err = perKeyName(k); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", where, err))
				} else if other, dup := named[key]; dup {
					errs = append(errs, fmt.Errorf("transport: PerKey[%q] and PerKey[%q] are both the key %q", other, k, key))
				} else {
					named[key] = k
				}
			}
			c, err := compile(cfg.PerKey[k])
			errs = append(errs, prefixed(where, err)...)
			perKey[strings.Clone(key)] = c // perhaps a piece of a larger string
		}
	}
	if nilBase(cfg.Base) {
		errs = append(errs, fmt.Errorf("transport: Base is a nil %T: leave Base nil (untyped) for the default, or give one that is not nil", cfg.Base))
	} else if _, ok := cfg.Base.(*http.Transport); !ok && cfg.Base != nil {
		if cfg.Policies.Replicas != nil {
			errs = append(errs, fmt.Errorf("transport: Policies: Replicas needs a Base that is an *http.Transport, whose clones are the lanes' connection pools; Base is a %T", cfg.Base))
		}
		for _, k := range slices.Sorted(maps.Keys(cfg.PerKey)) {
			if cfg.PerKey[k].Replicas != nil {
				errs = append(errs, fmt.Errorf("transport: PerKey[%q]: Replicas needs a Base that is an *http.Transport, whose clones are the lanes' connection pools; Base is a %T", k, cfg.Base))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t := &Transport{
		base:           cfg.Base,
		key:            cfg.Key,
		priorityHeader: ph,
		tenantHeader:   th,
		distrust:       cfg.DistrustHeaders,
		timeoutHeader:  toh,
		attemptHeader:  ah,
		def:            def,
		perKey:         perKey,
	}
	if cfg.Observer != nil {
		// A copy, like every config: the funcs are called concurrently,
		// so a later edit of the caller's struct would be a data race.
		o := *cfg.Observer
		t.obs = &o
	}
	if t.base == nil {
		t.base = cleanhttp.DefaultPooledTransport()
	}
	if b, ok := t.base.(*http.Transport); ok {
		t.connTrace = true
		t.streamTrace = b.HTTP2 != nil && b.HTTP2.StrictMaxConcurrentRequests
	}
	if t.key == nil {
		t.key, t.hostKeys = hostKey, true
	}
	max := cfg.MaxKeys
	if max == 0 {
		max = DefaultMaxKeys
	}
	t.scopes.init(max, t.newScope)
	if o := t.obs; o != nil && o.Attach != nil {
		o.Attach(stateSource{weak.Make(t)})
	}
	return t, nil
}

// nilBase reports whether rt is a nil pointer or func in a non-nil
// interface, as an unset `var b *http.Transport` is. Calling a nil func
// panics, and so does an *http.Transport's RoundTrip on a nil receiver,
// on the first call, far from its cause. Any pointer type is refused,
// not only *http.Transport: a nil wrapper (otelhttp's *Transport, a type
// of the caller's) panics just the same, and though Go allows methods on
// a nil receiver, a Base meant to be nil has the untyped nil, which
// means the default. A nil map, slice or channel is let through: its
// methods may use it as it is.
func nilBase(rt http.RoundTripper) bool {
	if rt == nil {
		return false
	}
	switch v := reflect.ValueOf(rt); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// prefixed returns err's errors, each one prefixed with where: the errors
// of a join (Set.Validate's, one per rule broken) one by one, so that
// every line of New's error says where it comes from. Nil is none.
func prefixed(where string, err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range j.Unwrap() {
			errs = append(errs, prefixed(where, e)...)
		}
		return errs
	}
	return []error{fmt.Errorf("%s: %w", where, err)}
}

// timesAttemptsOf reports whether an observer wants attempt latencies.
func timesAttemptsOf(o *policy.Observer) bool { return o != nil && o.AttemptDone != nil }

// stateSource is the policy.StateSource a Transport gives its Observer.
// It holds the Transport weakly, so that an Observer shared by transports
// that come and go, which keeps every source it is given, keeps none of
// them alive; States reports when its Transport is gone.
type stateSource struct{ t weak.Pointer[Transport] }

func (src stateSource) States(f func(key string, s policy.Snapshot)) (alive bool) {
	t := src.t.Value()
	if t == nil {
		return false
	}
	now := time.Now()
	t.scopes.each(func(s *scope) { f(s.key, s.snapshot(now)) })
	return true
}

// The errors of requests no policy can run. net/http's Transport says
// "http: nil Request.URL" for the second.
var (
	errNilRequest = errors.New("resilix: nil Request")
	errNilURL     = errors.New("resilix: nil Request.URL")
)

// checkRequest returns the request RoundTrip runs, or the error it returns
// at once, having closed the body, for a request that names no upstream:
// nil, or without a URL. Such a request has no key, so no Observer hears of
// it. A nil Header is read as empty: the request RoundTrip runs is then a
// shallow copy with an empty Header, which is what http.Client.Do gives
// its transport, and the caller's request keeps its nil.
func checkRequest(req *http.Request) (*http.Request, error) {
	switch {
	case req == nil:
		return nil, errNilRequest
	case req.URL == nil:
		closeBody(req.Body)
		return nil, errNilURL
	case req.Header == nil:
		r := new(http.Request)
		*r = *req
		r.Header = make(http.Header)
		return r, nil
	}
	return req, nil
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method, and of every key's lanes
// (policy.Replicas), those let go whose last stream has not ended yet
// included; http.Client.CloseIdleConnections reaches it through this.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
	t.scopes.each((*scope).closeLanes)
	t.let.closeIdle()
}

// Measured returns a snapshot of key's state, key as the Transport
// computes it (see Config.Key): with the default Key, "api.example.com"
// for requests to "https://API.example.com:443/". It does not create
// state for an unknown key, whose snapshot is the zero policy.Snapshot.
// Each policy's fields are meaningful only under its presence flag
// (HasBreaker, HasLimiter, ...).
func (t *Transport) Measured(key string) policy.Snapshot {
	s := t.scopes.lookup(key)
	if s == nil {
		return policy.Snapshot{}
	}
	return s.snapshot(time.Now())
}

type repeatableKey struct{}

// MarkRepeatable returns a copy of ctx under which requests may be retried
// and hedged whatever their method: the caller asserts that sending the
// request twice is safe. The body must still be replayable (no body,
// GetBody, or a body that fits in policy.Set.ReplayBuffer); http.NewRequest
// sets GetBody for the usual body types.
func MarkRepeatable(ctx context.Context) context.Context {
	return context.WithValue(ctx, repeatableKey{}, true)
}

func markedRepeatable(ctx context.Context) bool {
	v, _ := ctx.Value(repeatableKey{}).(bool)
	return v
}

// newLanes returns the lanes of a key whose set has Replicas on. While
// Endpoints has not answered, the lane to the request's own address dials
// through it.
func (t *Transport) newLanes(r *policy.Replicas, now time.Time) *lanes {
	base := t.base.(*http.Transport) // New checked
	return lane.New(*r, now, func(addr string, index int) *lanePool {
		var resolve policy.Resolver
		if addr == "" {
			resolve = r.Endpoints
		}
		return newLanePool(base, addr, resolve, &t.let)
	})
}

func (t *Transport) newScope(key string, now time.Time) *scope {
	c := t.def
	if pk, ok := t.perKey[key]; ok {
		c = pk
	}
	s := &scope{key: key, set: c}
	if c.retry != nil || c.hedge != nil {
		s.budget = gate.NewBudget(c.budget, now)
	}
	if c.hedge != nil {
		s.hedge = hedge.New(*c.hedge, now)
	}
	if c.breaker != nil {
		s.breaker = gate.NewBreaker(*c.breaker, now, rand.Uint64())
	}
	var tenants *gate.Tenants // one tracker for both gates, allocated by the first call naming a tenant
	if c.throttler != nil || c.limiter != nil {
		tenants = new(gate.Tenants)
	}
	if c.throttler != nil {
		s.throttle = gate.NewThrottler(*c.throttler, now, rand.Uint64(), tenants)
	}
	if c.limiter != nil {
		s.limiter = gate.NewLimiter(*c.limiter, now, tenants)
	}
	if c.bulkhead != nil {
		s.bulkhead = gate.NewBulkhead(*c.bulkhead)
	}
	if c.rateLimit != nil {
		var report func(policy.StoreTransition)
		if t.obs != nil {
			report = t.obs.StoreTransition
		}
		s.rate = gate.NewRateLimiter(*c.rateLimit, key, rand.Uint64(), report)
	}
	if c.replicas != nil {
		s.lanes = t.newLanes(c.replicas, now)
	}
	s.lastUsed.Store(now.UnixNano())
	return s
}
