// Package slogobserver logs what resilix does to calls with log/slog.
//
// [New] returns a *policy.Observer; put it in transport.Config.Observer,
// alone or joined with others (policy.JoinObservers):
//
//	rt, err := transport.New(transport.Config{
//		Policies: set,
//		Observer: slogobserver.New(logger, slogobserver.Options{}),
//	})
//
// It logs what resilix does beyond sending a call once: failed attempts,
// skipped retries, hedges, refusals, and the transitions of a key's
// breaker, adaptive limit, shared rate-limit store and lanes. A call whose
// attempts succeed logs nothing, unless [Options] asks for it.
//
// Every record is handed to the logger's handler with the event's Context,
// the caller's request context (for hedge legs too), so a handler that
// reads the context (one that adds the trace and span ids of the span in
// it, say) ties every line to its request. Records carry no source
// position (a zero PC): the line that logs is in resilix, not in the
// caller's code, so the handler's AddSource shows nothing.
//
// # Records
//
// Every record has the attribute key, the transport's scope key. The
// other attributes are named as package otelmetrics names its attributes
// (kind, outcome, reason, gate, priority, http.response.status_code,
// http.header), or as package oteltrace names its event attributes,
// without the resilix. prefix (attempt, latency, lane, threshold,
// tenant.heavy, retry_after), or, for what neither has, from and to (a
// transition's states or limits), for, duration, attempts, value,
// body_too_large and error. Enum values are the names the policy package
// gives them, as strings ("rate_limit", "half_open"); durations are
// slog.Duration values.
//
//	message              level               when, and its attributes
//	attempt failed       Info                a wire attempt failed (Outcome Failure):
//	                                         key, kind, attempt, outcome, latency, lane
//	                                         (with Replicas), http.response.status_code
//	                                         or error
//	attempt invalid      Warn                net/http refused to send the request as it
//	                                         is, the caller's bug (Outcome Invalid): as above
//	attempt discarded    Debug               resilix cancelled a hedge race's loser: as above
//	attempt done         Debug               with Options.Attempts only: every other attempt
//	                                         (succeeded, or the caller gave up): as above
//	call done            Debug, Info         with Options.Calls only: every call as RoundTrip
//	                                         returns, Info unless it succeeded or was
//	                                         canceled: key, outcome, priority, duration,
//	                                         attempts (wire attempts),
//	                                         http.response.status_code or error
//	retry skipped        Info                a failed attempt was not retried although the
//	                                         call had attempts left: key, attempt (the
//	                                         failed one), priority, reason, gate (reason
//	                                         gate), body_too_large (when true)
//	hedge started        Debug               a hedge leg was sent: key, attempt, priority,
//	                                         threshold
//	hedge won            Debug               a hedge leg's response won: the same
//	hedge suppressed     Debug               a hedge was due, a gate stopped it: key,
//	                                         priority, reason
//	refused              Debug, Info         an admission gate refused an attempt: key,
//	                                         kind, gate, priority, tenant.heavy, retry_after
//	                                         (when the gate gave one); Debug for the breaker
//	                                         and the throttler, Info for every other gate
//	breaker opened       Warn                the key's breaker opened: key, from, to
//	breaker half-open    Info                it lets probes through: key, from, to
//	breaker closed       Info                a probe closed it, or an operator did
//	                                         (Release, ResetBreaker): key, from, to
//	breaker isolated     Warn                an operator isolated the key
//	                                         (transport.Transport.Isolate): key, from, to
//	limit changed        Debug               the key's adaptive limit moved: key, from, to
//	store failing        Warn                the shared store of the key's RateLimit failed:
//	                                         key, from, to (fallback or refusing), error
//	store recovered      Info                it answers again: key, from, to
//	lane ejected         Warn                a lane of the key was ejected (Replicas): key,
//	                                         lane, reason, for
//	lane returned        Info                the first attempt on it after its ejection: key,
//	                                         lane, reason, for
//	pushback             Info                a 429 or 503 armed or extended the throttler's
//	                                         pushback: key, http.response.status_code,
//	                                         retry_after
//	malformed header     Info                a header resilix reads did not parse (or a
//	                                         tenant id could not be written): key,
//	                                         http.header, value (at most its first 64 bytes)
//
// The levels follow how often a record comes and whether it needs a
// person. A transition comes once per change and is Warn when the key got
// worse (a breaker opened, a store failing, a replica's lane ejected),
// Info when it got better. What comes once per call or answer it concerns
// is Info: a failed attempt, a skipped retry, a refusal, a pushback, a
// malformed header. What is routine, or follows from a record already
// logged, is Debug: hedges come on a few percent of a key's calls by
// design, the adaptive limit moves all the time, and the refusals of an
// open breaker and of the throttler come once per call for as long as a
// key is failing, after its breaker opened or its failed attempts and
// pushbacks were logged. A handler at Info (slog's default) thus logs what
// went wrong and how resilix answered it; one at Debug logs hedging too.
//
// The lane attribute is the lane's address (host:port) for a lane of
// Endpoints, or its index, "0" to "63", for a connection lane, as in
// policy.AttemptInfo.Lane; for is how long the ejection lasts.
//
// # Cost
//
// Each func asks the handler whether its level is enabled before it builds
// anything: a record the handler filters out costs that call and no
// allocation. Without Options.Calls the Observer has no CallDone, so the
// transport builds no CallInfo for it; its AttemptDone, which it needs for
// failed attempts, makes the transport time every wire attempt, a clock
// read it makes anyway for a key with a hedge, breaker, throttler or
// limiter.
package slogobserver
