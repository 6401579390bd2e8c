// Package transport is resilix's http.RoundTripper: set it as an
// http.Client's Transport and every request runs through one fixed chain of
// policies, with state kept per upstream (per key, by default the host):
//
//	retry → hedge → throttler → breaker → limiter → bulkhead → rateLimit → timeout → base
//
// New validates the whole configuration once and reports every invalid
// field by name; the Transport then never panics on anything a caller or a
// server sends. Which policies run, and how, is a policy.Set; see package
// policy.
//
// What a caller can count on, on every path:
//
//   - RoundTrip returns a response or an error, never both, never neither,
//     and never modifies the caller's request. The request's body is
//     closed; it is only ever replayed through GetBody.
//   - A request is sent more than once (retried or hedged) only when that
//     is safe: an idempotent method, an Idempotency-Key header, or a context
//     marked with MarkRepeatable, and a body that GetBody can re-create.
//   - Every response resilix throws away (a superseded retry, the loser of
//     a hedge) is closed, and a superseded one drained first so its
//     connection can be reused.
//   - The response returned keeps its attempt alive until its body is read
//     to the end or closed; close it, as with any http.Client response.
//   - No wait (backoff, queue, rate limit, hedge) outlives the request's
//     context. A wire call in flight is cut short by cancelling its
//     context, which net/http's transport honours; a base RoundTripper that
//     ignores cancellation cannot be hurried, and a call over it may
//     outlive its deadline by as long as the base takes.
//   - Refusals are *policy.RejectedError, usable with errors.Is and
//     errors.As through http.Client's *url.Error.
//
// An idle Transport holds no goroutine or timer: state moves lazily,
// from the time of the calls that read it. The timers and goroutines a call
// needs (a per-attempt timeout, a hedge) end with it.
package transport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/policy"
)

// Config configures a Transport. The zero Config is valid: it forwards to a
// pooled cleanhttp transport with no policy on, and is then a plain
// RoundTripper with per-host bookkeeping.
type Config struct {
	// Base sends the wire attempts. If nil,
	// cleanhttp.DefaultPooledTransport() is used.
	Base http.RoundTripper

	// Policies is the chain applied to every key without an entry in
	// PerKey.
	Policies policy.Set

	// PerKey replaces Policies for the keys it names (whole sets, not
	// merged field by field). Every entry is validated by New.
	PerKey map[string]policy.Set

	// Key maps a request to the key whose state it shares: breaker,
	// budget, latency window, limits. If nil, req.URL.Host is used, so
	// each upstream host:port is isolated from the others.
	Key func(*http.Request) string

	// MaxKeys bounds the number of keys whose state is kept. When a new
	// key arrives and the bound is reached, the least recently used key
	// (approximately: the oldest of a small sample) is forgotten, so
	// memory stays bounded whatever hosts requests name. If zero, 1024 is
	// used.
	MaxKeys int

	// Observer receives events about calls, attempts and refusals. If
	// nil, nothing is reported and nothing is paid.
	Observer *policy.Observer

	// PriorityHeader is the request header a priority is read from when
	// the context carries none (shedding.WithPriority wins). If empty,
	// "Resilix-Priority" is used. An unparsable value is tolerated: the
	// call goes on as Critical and the header is reported to
	// Observer.MalformedHeader and counted in Measured.
	PriorityHeader string

	// TenantHeader is the request header a tenant id is read from when the
	// context carries none (tenant.With wins). If empty, "Resilix-Tenant"
	// is used.
	TenantHeader string
}

// DefaultMaxKeys is the MaxKeys used when the field is zero.
const DefaultMaxKeys = 1024

// Transport is an http.RoundTripper that applies resilix's policies to each
// request. Build one with New; it is safe for concurrent use, and meant to
// be shared for the life of the process like http.DefaultTransport.
type Transport struct {
	base           http.RoundTripper
	key            func(*http.Request) string
	obs            *policy.Observer
	priorityHeader string
	tenantHeader   string
	def            *chain
	perKey         map[string]*chain
	scopes         registry
}

// New validates cfg and returns a Transport. Every invalid field is
// reported, by name, in the returned error; New never corrects a value
// silently. New copies what it keeps, the policies, the PerKey map and the
// Observer: editing any of them afterwards changes nothing.
func New(cfg Config) (*Transport, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("transport: MaxKeys must be >= 0, got %d", cfg.MaxKeys)
	}
	ph, err := headerName("PriorityHeader", cfg.PriorityHeader, "Resilix-Priority")
	if err != nil {
		return nil, err
	}
	th, err := headerName("TenantHeader", cfg.TenantHeader, "Resilix-Tenant")
	if err != nil {
		return nil, err
	}
	def, err := compile(cfg.Policies)
	if err != nil {
		return nil, fmt.Errorf("transport: Policies: %w", err)
	}
	t := &Transport{
		base:           cfg.Base,
		key:            cfg.Key,
		priorityHeader: ph,
		tenantHeader:   th,
		def:            def,
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
	if t.key == nil {
		t.key = hostKey
	}
	if len(cfg.PerKey) > 0 {
		t.perKey = make(map[string]*chain, len(cfg.PerKey))
		for _, k := range slices.Sorted(maps.Keys(cfg.PerKey)) {
			c, err := compile(cfg.PerKey[k])
			if err != nil {
				return nil, fmt.Errorf("transport: PerKey[%q]: %w", k, err)
			}
			t.perKey[k] = c
		}
	}
	max := cfg.MaxKeys
	if max == 0 {
		max = DefaultMaxKeys
	}
	t.scopes.init(max, t.newScope)
	if o := t.obs; o != nil && o.Attach != nil {
		o.Attach(stateSource{t})
	}
	return t, nil
}

// timesAttemptsOf reports whether an observer wants attempt latencies.
func timesAttemptsOf(o *policy.Observer) bool { return o != nil && o.AttemptDone != nil }

// stateSource is the policy.StateSource a Transport gives its Observer.
type stateSource struct{ t *Transport }

func (src stateSource) States(f func(key string, s policy.State)) {
	now := time.Now()
	src.t.scopes.each(func(s *scope) { f(s.key, s.state(now)) })
}

func hostKey(r *http.Request) string { return r.URL.Host }

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

// headerName validates a configured header name and returns it in
// canonical form, so that the hot path can index req.Header directly.
func headerName(field, v, def string) (string, error) {
	if v == "" {
		v = def
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return "", fmt.Errorf("transport: %s %q is not a valid header name", field, v)
		}
	}
	return textproto.CanonicalMIMEHeaderKey(v), nil
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method; http.Client.CloseIdleConnections
// reaches it through this.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
}

// Measured is a snapshot of what a key's state has learned. Fields are zero
// until there is evidence.
type Measured struct {
	// Known is false when the key has no state (never called, or
	// forgotten under MaxKeys); every other field is then zero.
	Known bool

	// HedgeThreshold is the latency after which a call to this key would
	// be hedged: zero until enough samples are in.
	HedgeThreshold time.Duration
	// HedgesStarted and HedgesWon count the hedges of the hedge window;
	// their ratio is the win rate. HedgeAllowance is the share of due
	// hedges that Hedge.WinRate lets through (1 without it).
	HedgesStarted, HedgesWon uint64
	HedgeAllowance           float64

	// Budgeted is true when retries and hedges draw from a budget;
	// BudgetBalance is then the tokens left.
	Budgeted      bool
	BudgetBalance float64

	// BreakerState is the breaker's state; BreakerClosed when there is no
	// breaker.
	BreakerState policy.BreakerState
	// ErrorRate and TripPoint are the breaker's windowed failure rate and
	// the rate at which it trips.
	ErrorRate, TripPoint float64

	// BulkheadInFlight is the number of bulkhead slots held.
	BulkheadInFlight int

	// LimiterLimit is the adaptive concurrency limit, LimiterInFlight the
	// attempts holding it and LimiterQueued those waiting for it.
	LimiterLimit, LimiterInFlight, LimiterQueued int

	// Pressure is how hard the shedding gates are pushing back, in [0, 1]:
	// the larger of the limiter's queue fill and the throttler's
	// rejection probability.
	Pressure float64

	// MalformedHeaders counts priority headers on requests and
	// Retry-After headers on responses that could not be parsed.
	MalformedHeaders uint64
}

// Measured returns a snapshot of key's state. It does not create state for
// an unknown key.
func (t *Transport) Measured(key string) Measured {
	s := t.scopes.lookup(key)
	if s == nil {
		return Measured{}
	}
	return s.measured(time.Now())
}

type repeatableKey struct{}

// MarkRepeatable returns a copy of ctx under which requests may be retried
// and hedged whatever their method: the caller asserts that sending the
// request twice is safe. The body must still be replayable (GetBody, or no
// body); http.NewRequest sets GetBody for the usual body types.
func MarkRepeatable(ctx context.Context) context.Context {
	return context.WithValue(ctx, repeatableKey{}, true)
}

func markedRepeatable(ctx context.Context) bool {
	v, _ := ctx.Value(repeatableKey{}).(bool)
	return v
}
