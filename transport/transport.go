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
//     closed; it is only ever replayed through GetBody or, for a body
//     without GetBody, from the copy of at most policy.Set.ReplayBuffer
//     bytes kept as the first attempt read it.
//   - A request is sent more than once (retried or hedged) only when that
//     is safe: an idempotent method, an Idempotency-Key header, or a context
//     marked with MarkRepeatable, and a body that can be sent again:
//     none, one GetBody re-creates, or one that fits in
//     policy.Set.ReplayBuffer; or, for a retry, when the attempt before
//     it provably never reached the server (see "What never left",
//     below).
//   - Every response resilix throws away (a superseded retry, the loser of
//     a hedge) is closed. A superseded one is drained first, in the
//     background, at most 4 KiB for at most 100 ms, so that its connection
//     can be reused without the caller ever waiting on it. A hedge leg
//     that loses while still on the wire is cancelled, but not at once:
//     over HTTP/1.1 a request cancelled in flight takes its connection
//     with it, so it has 100 ms to bring its headers, and is then drained
//     the same way. The leg the caller's own goroutine runs is cancelled
//     at once when it loses.
//   - A response is thrown away only once the attempt that supersedes it
//     is on its way: when a retry cannot be sent (a gate refuses it, the
//     budget is spent, the deadline is too close, Retry-After asks too
//     much), the caller gets the last response, body intact, and the
//     Observer hears why. Only a call whose first attempt is refused gets a
//     *policy.RejectedError.
//   - The response returned keeps its attempt alive until its body is read
//     to the end or closed; close it, as with any http.Client response.
//     Once it is closed, no attempt touches the caller's request: hedge
//     legs send a deep copy, so the request may be reused.
//   - No wait (backoff, queue, rate limit, hedge) outlives the request's
//     context, and a wait the caller's context ends returns the context's
//     error, never a refusal. A request whose context is already done
//     when RoundTrip is called gets that error at once, having cost
//     nothing: no wire call, no gate asked, no rate-limit token, no state
//     created for its key. A wire call in flight is cut short by
//     cancelling its context, which net/http's transport honours; a base
//     RoundTripper that ignores cancellation cannot be hurried, and a call
//     over it may outlive its deadline by as long as the base takes.
//   - No goroutine outlives its call, however many legs a hedged round
//     starts, except a bounded background drain, a losing hedge leg for
//     at most its time to bring its headers and its drain (above), a
//     hedge leg that lost while inside a base that ignores cancellation,
//     which ends when the base returns, and a refresh of a key's
//     policy.Replicas Endpoints, which ends when its Resolve returns
//     (within Refresh, if Resolve heeds its context).
//   - A panic in the base releases everything the attempt held (permits,
//     bulkhead slot, context) and reaches the caller: on a hedge leg's
//     goroutine it is recovered, the round's other legs are cancelled and
//     their bodies closed, and it is re-raised on the caller's goroutine.
//   - Refusals are *policy.RejectedError, usable with errors.Is and
//     errors.As through http.Client's *url.Error.
//   - An error after more than one wire attempt says how many were made,
//     "resilix: 3 attempts: attempt timed out: ...", and errors.Is and
//     errors.As reach the last attempt's error through it (and through
//     *url.Error, whose Timeout still reports a timeout). A call that made
//     one attempt returns its error as it is, and the caller's own
//     cancellation or deadline always comes back as the context's error
//     itself, so that err == context.Canceled keeps working.
//
// # What never left
//
// An attempt whose error proves that the request never reached the server
// may be retried whatever its method, a plain POST included: sending it
// again cannot repeat anything the server did. The proof is the error the
// base returned, and only these errors are proof (anywhere in the chain
// errors.Unwrap follows):
//
//   - a failure to connect: a *net.OpError whose Op is "dial" (connection
//     refused, no route to host, a failed DNS lookup, a dial timeout) or
//     "proxyconnect" (net/http's, for a proxy it could not reach);
//   - a refused TLS handshake: a TLS alert that only answers handshake
//     messages (handshake_failure, protocol_version,
//     insufficient_security, unrecognized_name, no_application_protocol,
//     the certificate alerts, ...), a first record that is not TLS, an
//     ECH rejection, net/http's "TLS handshake timeout", or a
//     certificate the client did not trust, which is never retried since
//     sending again only repeats the handshake;
//   - over HTTP/2, a stream the server refused (RST_STREAM with
//     REFUSED_STREAM) or did not process (a GOAWAY whose last stream id is
//     below the stream's), and a connection that could take no stream, as
//     net/http words these errors: it exports no type for them, so they
//     are told by their whole messages (including net/http's "cannot
//     retry err [...] after Request.Body was written", which it returns
//     for a body without GetBody).
//
// Anything else is ambiguous and is not retried for a request that may
// not be sent twice: a reset or a timeout after the request was written,
// an EOF on a reused connection, a GOAWAY that may cover the stream. When
// in doubt, resilix does not repeat.
//
// Such a retry is a wire attempt counted against Attempts; it needs Retry
// (and Retry.If, when set, to ask for it), passes the gates, and needs a
// body it can replay. With Replicas, while a lane the call has not used
// is open (neither ejected nor held back by a Retry-After), it is sent
// there at once, with no backoff, and draws no token from the budget:
// it cost the host nothing, and the replica that was not there says
// nothing of the others. Otherwise (every lane used or blocked, or no
// Replicas) it is a retry like any other: it draws a token, and is not
// sent when none is left, and it waits the backoff. Observer.AttemptDone
// reports it with Kind AttemptRetry and Reason RetryUnsent. Hedges are
// unchanged: a request that may not be sent twice is never hedged.
//
// # What could not be sent
//
// A request that net/http refuses to send as it is, before writing a
// byte of it, is the caller's bug, and no outcome at all: the dependency
// never saw it, and sending it again gets the same refusal. Only these
// errors are such a refusal (anywhere in the chain errors.Unwrap
// follows), told by net/http's whole messages, since it exports no type
// for them:
//
//   - before dialing: an unsupported scheme (unsupported protocol scheme
//     "ftp"), an invalid header or trailer field name or value, an
//     invalid method, a URL with no Host;
//   - over HTTP/1, once connected: a control character in the request
//     URI, an invalid Host sent to a proxy, a trailer key that may not be
//     one (net/http sometimes reports these as the read error of the
//     connection it closed for them, which is a transport error like any
//     other);
//   - over HTTP/2: an invalid Host or :path, a connection header HTTP/2
//     forbids (Upgrade, Transfer-Encoding, Connection).
//
// Such an attempt is made once: it is not retried, whatever Attempts and
// the method allow, and no retry is reported skipped, since it is no
// failure; a hedged round ends as soon as it comes back, starting no
// hedge. Classify and Retry.If are not asked. No policy learns from it:
// the throttler, the breaker and the limiter release it as no evidence (a
// caller's bug cannot open the breaker for every caller of the host), the
// latency window records nothing, and no budget token is drawn: the
// call takes back what it deposited, so that it earns other calls no
// retries.
// Observer.AttemptDone and Observer.CallDone report it with Outcome
// policy.Invalid, and the caller gets net/http's error as it is, never
// wrapped.
//
// An idle Transport holds no goroutine: state moves lazily, from the time
// of the calls that read it. The goroutines a call needs (a hedge) end
// with it, as do a hedged round's timer and Timeout.Idle's one timer per
// response body (when the body is read to its end, fails or is closed).
// The timer of a per-attempt timeout is disarmed when its call no longer
// needs it, not stopped, so that the next call can take it over without a
// timer operation: it fires once, at most a PerAttempt after its last
// call, holding nothing of that call, and rests.
//
// # Across services
//
// A key whose policy.Set has Propagate on sends, with each wire attempt
// (the first, each retry, each hedge leg), what the service it calls needs
// to take its part in the call's overload handling; package admission
// reads it back on the server. The headers go on the attempt's own copy of
// the request, never on the caller's, and carry exactly what the
// transport derives for the call, one value each, and only when there is
// one: a value the request carried for one of them is replaced, or
// removed where the transport has none, so that a request copied from an
// incoming one (a reverse proxy's) forwards nothing its caller wrote. A
// name is the header in any spelling: a Header built in-process may hold
// h["resilix-tenant"], which net/http writes as it is and the next tier
// reads as Resilix-Tenant, so the transport reads it (the canonical
// spelling's value first) and removes it with the others:
//
//   - Config.PriorityHeader: the call's priority as the transport reads it
//     (the context's, shedding.WithPriority, else the request's header's
//     first value), as Priority.String spells it, which
//     shedding.ParsePriority reads. A call that names no priority at all,
//     or whose header does not parse, sends none, rather than Critical,
//     this transport's default: the upstream then applies its own default
//     (admission.Config.DefaultPriority), which is its decision to make.
//   - Config.TenantHeader: the call's tenant id as the transport reads it
//     (the context's, tenant.With, else the request's header's first
//     value). An empty id is none: a context holding the empty tenant,
//     as admission puts there for an untrusted caller, sends no tenant
//     whatever the request's header says. An id that cannot be a header
//     value (a control character) would fail the attempt in net/http: it
//     is not written, and is reported to Observer.MalformedHeader, once a
//     call.
//   - Config.TimeoutHeader: how long the attempt may still take, in whole
//     milliseconds rounded down: the time left before the caller's
//     deadline, or the attempt's per-attempt timeout (policy.Timeout, as
//     the call's Override narrows it) when that is shorter, measured as
//     the request is handed to Config.Base and, when Config.Base is an
//     *http.Transport that dials a connection for it, again once that
//     connection is there, less a transit margin of 5ms for the time it
//     takes to reach the next tier and be read there. It is 0 when no
//     more than the margin is left, and written only when there is a
//     deadline or a per-attempt timeout. So the next tier's deadline (its
//     arrival plus the time announced) is 5 to 6ms earlier than the
//     caller's, less the transit, and later only when the transit takes
//     more than that: a network hop of more than 5ms, a server too busy
//     to read the request at once (over loopback on a busy 2-core
//     machine, up to 4 calls of 2000).
//   - Config.AttemptHeader: the attempt's number among the call's wire
//     attempts: 1 for the first, then each retry and hedge leg its own
//     next number, as Envoy's x-envoy-attempt-count counts them. The
//     number is this hop's: it says nothing of the attempts of the
//     callers above.
//
// A key without Propagate sends the request's headers as they are.
//
// The other half of the exchange holds on every key, Propagate or not: a
// call made for a request that was itself a retry or a hedge of its
// caller's call (attempt.Repeated on the call's context; admission puts
// the number there) is sent once, neither retried nor hedged, as if its
// context carried Override{Attempts: 1}, and neither deposits in its key's
// budget nor draws from it. What decides is how the request being served
// arrived, not where this call goes: its caller is already repeating the
// work, and retries here would multiply with its own, whichever upstream
// this call reaches (three tiers that each try four times make 4³ = 64
// calls on the last, as the Google SRE book counts in chapter 22). Left
// out of the budget, such calls do not let the callers' retries pay for
// this key's. As with an Override, the Observer hears of no retry or
// hedge the rule leaves out; Measured counts the calls it narrowed, on
// keys that retry or hedge, in RepeatsSentOnce.
//
// # Isolating a key
//
// Isolate, Release and ResetBreaker let an operator overrule a key's
// breaker during an incident: take a dependency out of rotation before its
// breaker would, or put it back before its breaker would.
//
// Isolate a key when calling it does harm: it is known to be down or
// wrong (a bad deploy, data it must not receive), or its failures are
// slow enough to tie up callers before the breaker's rules trip. From
// then on every call to the key is refused at once, before any gate is
// asked and without a wire call, with a *policy.RejectedError whose Gate
// is GateBreaker and whose Err is policy.ErrIsolated, which matches
// policy.ErrCircuitOpen too: callers that already handle an open breaker
// (a fallback, a cached answer) handle an isolated key the same way, and
// those that care can tell them apart. It has no RetryAfter: nothing but
// Release ends it. Calls already on the wire finish, and what they teach
// the breaker is dropped; their retries and hedges are refused like any
// other call. The key's snapshot shows BreakerState policy.BreakerIsolated
// ("isolated"), the Observer hears a BreakerTransition to it, and
// otelmetrics' resilix.breaker.state gauge reads 3.
//
// Release undoes it: the breaker closes with an empty window, keeping the
// baseline it learned, and judges the key by its own rules again, so a key
// that is still broken trips again after a few failures. ResetBreaker is
// the other override, for a breaker that opened on a fault now fixed: it
// closes an open or half-open breaker at once, the same way, rather than
// waiting for the opening to run out and a probe to succeed.
package transport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"weak"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/internal/httpx"
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
	// "Resilix-Tenant" is used.
	TenantHeader string

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

// Transport is an http.RoundTripper that applies resilix's policies to each
// request. Build one with New; it is safe for concurrent use, and meant to
// be shared for the life of the process like http.DefaultTransport.
type Transport struct {
	base           http.RoundTripper
	connTrace      bool // base is an *http.Transport: it calls GotConn on the request's goroutine before writing it
	key            func(*http.Request) string
	hostKeys       bool // Key is the default: keys are canonical authorities
	obs            *policy.Observer
	priorityHeader string
	tenantHeader   string
	timeoutHeader  string
	attemptHeader  string
	def            *chain
	perKey         map[string]*chain
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
	var perKey map[string]*chain
	if len(cfg.PerKey) > 0 {
		perKey = make(map[string]*chain, len(cfg.PerKey))
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
	if _, ok := cfg.Base.(*http.Transport); !ok && cfg.Base != nil {
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
	_, t.connTrace = t.base.(*http.Transport)
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

// hostKey is the default Key: the request's canonical authority.
func hostKey(r *http.Request) string { return canonicalKey(r.URL.Scheme, r.URL.Host) }

// canonicalKey returns the key of a request to authority (a URL.Host,
// host[:port]) under scheme: the authority with its host in lower case
// (ASCII letters, up to an IPv6 zone, which is kept as is) and without a
// trailing dot, and its port without leading zeros, dropped when empty or
// the scheme's default (80 for http and ws, 443 for https and wss). An IPv6
// literal keeps its brackets, and gains them if it has none.
//
// It is on every call's path, so it cuts the key from authority when it
// can, and allocates only to change case, to keep a port after a trailing
// dot, or for a port with leading zeros.
func canonicalKey(scheme, authority string) string {
	host, port, hasPort := splitAuthority(authority)
	if hasPort {
		if port = trimZeros(port); port == "" || port == defaultPort(scheme) {
			hasPort = false
		}
	}
	bracket := false
	switch {
	case strings.HasPrefix(host, "["):
	case strings.IndexByte(host, ':') >= 0:
		bracket = true // an IPv6 literal without its brackets
	default:
		host = strings.TrimRight(host, ".")
	}
	host = lowerASCII(host)
	switch {
	case bracket:
	case !hasPort:
		return host // authority's prefix, or its lowered copy
	case len(authority) == len(host)+1+len(port) && strings.HasPrefix(authority, host):
		return authority // nothing to change
	}
	var b strings.Builder
	b.Grow(len(host) + len(port) + 3)
	if bracket {
		b.WriteByte('[')
	}
	b.WriteString(host)
	if bracket {
		b.WriteByte(']')
	}
	if hasPort {
		b.WriteByte(':')
		b.WriteString(port)
	}
	return b.String()
}

// errNotHost is the error of a PerKey entry that names no host.
var errNotHost = errors.New("not a host[:port]")

// perKeyName returns the key a PerKey entry names under the default Key.
// An entry is a host, an IPv4 address or an IPv6 one (with or without
// brackets), with an optional port, written as a URL's authority is; it
// is canonicalized as a request's authority is, except that having no
// scheme, both 80 and 443 are dropped. So "API.example.com.:443" names
// "api.example.com", and so does "api.example.com:80". An IPv6 zone is
// written as keys show it, "[fe80::1%en0]", not escaped.
func perKeyName(k string) (string, error) {
	a := k
	switch {
	case strings.HasPrefix(a, "["):
		host, port, _ := splitAuthority(a)
		if !strings.HasSuffix(host, "]") || !isIPv6(host[1:len(host)-1]) || !isPort(port) {
			return "", errNotHost
		}
	case strings.Count(a, ":") > 1:
		if !isIPv6(a) {
			return "", errNotHost
		}
		a = "[" + a + "]"
	default:
		// url.Parse knows which bytes a host may hold; the authority is
		// all it may find.
		u, err := url.Parse("//" + a)
		if err != nil || strings.ContainsAny(a, "/?#@") || u.Host != a {
			return "", errNotHost
		}
	}
	host, port, hasPort := splitAuthority(a)
	if hasPort && port != "" {
		n, err := strconv.ParseUint(port, 10, 64)
		switch {
		case err != nil:
			return "", errNotHost
		case n == 0 || n > 65535:
			return "", fmt.Errorf("%w: port out of range", errNotHost)
		case n == 80 || n == 443:
			a = host
		}
	}
	key := canonicalKey("", a)
	if h, _, _ := splitAuthority(key); h == "" || h == "[]" {
		return "", errNotHost
	}
	return key, nil
}

// isIPv6 reports whether s is an IPv6 address, with an optional zone.
func isIPv6(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Is6()
}

// isPort reports whether s is empty or digits, as a URL's port is.
func isPort(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// splitAuthority splits host[:port]. A bracketed IPv6 host keeps its
// brackets; an unbracketed one (more than one colon) has no port.
func splitAuthority(a string) (host, port string, hasPort bool) {
	if strings.HasPrefix(a, "[") {
		i := strings.LastIndexByte(a, ']')
		if i >= 0 && strings.HasPrefix(a[i+1:], ":") {
			return a[:i+1], a[i+2:], true
		}
		return a, "", false
	}
	i := strings.IndexByte(a, ':')
	if i < 0 || strings.IndexByte(a[i+1:], ':') >= 0 {
		return a, "", false
	}
	return a[:i], a[i+1:], true
}

// trimZeros returns a port's digits without leading zeros.
func trimZeros(port string) string {
	if t := strings.TrimLeft(port, "0"); t != "" || port == "" {
		return t
	}
	return "0"
}

// defaultPort returns the port a scheme implies, or "".
func defaultPort(scheme string) string {
	switch {
	case strings.EqualFold(scheme, "http"), strings.EqualFold(scheme, "ws"):
		return "80"
	case strings.EqualFold(scheme, "https"), strings.EqualFold(scheme, "wss"):
		return "443"
	}
	return ""
}

// lowerASCII returns s with its ASCII upper case letters lowered, up to a
// '%' (an IPv6 zone, whose case is the interface's), or s itself when
// there are none.
func lowerASCII(s string) string {
	end := strings.IndexByte(s, '%')
	if end < 0 {
		end = len(s)
	}
	for i := 0; i < end; i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < end; j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
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
