// Package slogobserver logs what resilix does to calls with log/slog.
//
// [NewLogger] returns a [Logger]; put its Observer in
// transport.Config.Observer, alone or joined with others
// (policy.JoinObservers), and call its Flush at shutdown, so that the
// last interval's summaries are written ([New] returns the Observer
// alone, for a caller that needs no Flush):
//
//	logs := slogobserver.NewLogger(logger, slogobserver.Options{})
//	defer logs.Flush()
//	rt, err := transport.New(transport.Config{
//		Policies: set,
//		Observer: logs.Observer(),
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
// Every record has the attribute key, the transport's scope key, but the
// summary of the other keys, which has other_keys in its place. The
// other attributes are named as package otelmetrics names its attributes
// (kind, outcome, reason, gate, priority, http.response.status_code,
// http.header), or as package oteltrace names its event attributes,
// without the resilix. prefix (attempt, lane, tenant.heavy), or, for what
// neither has, from and to (a transition's states or limits), attempts,
// value, body_too_large, stalled, added, removed, lanes, other_keys, share,
// fair_share and error. Enum values are
// the names the policy package gives them, as strings ("rate_limit",
// "half_open"). Durations are numbers of milliseconds, with their
// fraction, in attributes named for the unit: latency_ms, duration_ms,
// threshold_ms, retry_after_ms, for_ms, since_ms (slog's JSON handler
// would write a time.Duration as integer nanoseconds, its text handler as
// "1.5ms"; a number reads the same in both, and sums and sorts in a log
// pipeline).
//
//	message              level               when, and its attributes
//	breaker opened       Warn                the key's breaker opened: key, from, to
//	breaker half-open    Info                it lets probes through: key, from, to
//	breaker closed       Info                a probe closed it, or an operator did
//	                                         (Release, ResetBreaker): key, from, to
//	breaker isolated     Warn                an operator isolated the key
//	                                         (transport.Transport.Isolate): key, from, to
//	store failing        Warn                the shared store of the key's RateLimit failed:
//	                                         key, from, to (fallback or refusing), error
//	store recovered      Info                it answers again: key, from, to
//	lane ejected         Warn                a lane of the key was ejected (Replicas): key,
//	                                         lane, reason, for_ms
//	lane returned        Info                the first attempt on it after its ejection: key,
//	                                         lane, reason, for_ms
//	lane starved         Warn                a lane of the key, not ejected, got below a
//	                                         tenth of its fair share of the key's attempts
//	                                         over a 10 s window (below): key, lane,
//	                                         attempts (its own), share (of the key's),
//	                                         fair_share (1 / the lanes not ejected),
//	                                         since_ms (the window)
//	lane fed again       Info                a starved lane got a fifth of its fair share
//	                                         or more over a window: the same
//	lanes changed        Info                an answer of the key's Endpoints changed its
//	                                         lanes: key, added, removed (addresses), lanes
//	summary              Info                each Options.Summary (10s), for each of the
//	                                         Options.SummaryKeys (4) keys with the most
//	                                         per-call records below that are counted: key,
//	                                         since_ms (the span counted), and each count
//	                                         that is not zero: attempts_failed,
//	                                         attempts_invalid, retries_skipped, pushbacks,
//	                                         malformed_headers, and refused, a group by
//	                                         gate (refused.limiter); and one more for the
//	                                         other keys, if any: other_keys (how many keys
//	                                         it sums) in place of key, since_ms, the sums
//	attempt failed       Debug, counted      a wire attempt failed (Outcome Failure):
//	                                         key, kind, attempt, outcome, latency_ms, lane
//	                                         (with Replicas), stalled (true, for a timeout
//	                                         the client's own stall ended late, which no
//	                                         gate counted), http.response.status_code
//	                                         or error
//	attempt invalid      Debug, counted      net/http refused to send the request as it
//	                                         is, the caller's bug (Outcome Invalid): as above
//	retry skipped        Debug, counted      a failed attempt was not retried although the
//	                                         call had attempts left: key, attempt (the
//	                                         failed one), priority, reason, gate (reason
//	                                         gate), body_too_large (when true)
//	refused              Debug, counted      an admission gate refused an attempt: key,
//	                                         kind, gate, priority, tenant.heavy,
//	                                         retry_after_ms (when the gate gave one)
//	pushback             Debug, counted      a 429 or 503 armed or extended the throttler's
//	                                         pushback: key, http.response.status_code,
//	                                         retry_after_ms
//	malformed header     Debug, counted      a header resilix reads did not parse (or a
//	                                         tenant id could not be written): key,
//	                                         http.header, value (at most its first 64 bytes)
//	attempt discarded    Debug               resilix cancelled a hedge race's loser: key,
//	                                         kind, attempt, outcome, latency_ms, lane, error
//	hedge started        Debug               a hedge leg was sent: key, attempt, priority,
//	                                         threshold_ms
//	hedge won            Debug               a hedge leg's response won: the same
//	tie cancelled        Debug               a leg of a tied round was cancelled, its twin
//	                                         having started first: the same
//	tie ran twice        Debug               a second leg of a tied round started: the same
//	hedge suppressed     Debug               a hedge was due, a gate stopped it: key,
//	                                         priority, reason
//	limit changed        Debug               the key's adaptive limit moved: key, from, to
//	attempt done         Debug               with Options.Attempts only: every other attempt
//	                                         (succeeded, or the caller gave up): as attempt
//	                                         failed
//	call done            Debug, Info         with Options.Calls only: every call as RoundTrip
//	                                         returns, Info unless it succeeded or was
//	                                         canceled: key, outcome, priority, duration_ms,
//	                                         attempts (wire attempts),
//	                                         http.response.status_code or error
//
// The levels follow how often a record comes and whether it needs a
// person, so that a handler at Info (slog's default) can be left on: it
// gets no line per call. A change comes once per change and is Warn when
// the key got worse (a breaker opened, a store failing, a replica's lane
// ejected or starved), Info when it got better or moved (a lane back or
// fed again, a key's lanes changed).
// What comes once per call, a failed attempt, a refusal, a skipped retry,
// is Debug, and counted: the key's summary line says at Info how many
// there were, and an interval writes at most SummaryKeys+1 summaries
// however many keys had them. Hedges are routine by design and the adaptive limit moves
// all the time: Debug, and not counted. A host failing a fifth of its
// calls at 60 calls a second, half of them Bulk calls shed by its rate
// limit, logs 2 lines at Info in 30 seconds, both summaries, where a line
// per failed attempt and refusal would be about 1,170
// (TestSlogOperatorScenario). A client calling 601 hosts in 30 seconds,
// each failing its one call, logs 15 lines at Info in those 30 seconds,
// 5 summaries an interval (TestSlogManyHostsFailingOnce).
//
// The summaries need no timer: an interval starts with a counted event,
// and its counts are written by the first counted event, of any key,
// after it, which starts the next one; Flush writes them at once. The
// counts of the last interval before the events stop are written by
// Flush only. The Logger keeps the counts of at most 1024 keys an
// interval (the events of a key past them are in the other keys'
// summary, which does not count it in other_keys), and nothing when
// Summary is negative or the handler is above Info.
//
// The lane attribute is the lane's address (host:port) for a lane of
// Endpoints, or its index, "0" to "63", for a connection lane, as in
// policy.AttemptInfo.Lane; for_ms is how long the ejection lasts.
//
// A lane starved is one the picker all but stopped sending to without
// ejecting it: a replica much slower than the others, one that refuses
// its connections or holds back its attempts with Retry-After. The Logger
// counts each key's attempts by lane (policy.AttemptInfo.Lane) over
// windows of 10 s, the picker's own horizon, each ended by the key's
// first attempt after it; a window is judged when the fair share, its
// attempts over the lanes not ejected, is 20 attempts or more, so that a
// lane drawn little by chance is not called starved. A lane is judged
// over the windows that start after it is first seen (by an attempt or an
// answer of Endpoints) or back from an ejection; an ejected lane is not
// judged, its ejection being its record; a lane Endpoints removed, and
// the lane that dialed the request's own address before Endpoints' first
// answer, are forgotten. A connection lane never picked at all is not
// seen. Lanes are watched only when the handler is at Warn or below.
//
// # Cost
//
// Each func asks the handler whether its level is enabled before it builds
// anything: a record the handler filters out costs that call and no
// allocation. A counted event, with the handler at Info, costs a lock and
// a map lookup, and an allocation when its key starts counting. An
// attempt on a lane, with the handler at Warn or below, costs a lock, a
// map lookup and a search of the key's lanes, and an allocation when its
// key or lane starts being watched. Without Options.Calls the Observer has no CallDone, so the
// transport builds no CallInfo for it; its AttemptDone, which it needs for
// failed attempts, makes the transport time every wire attempt, a clock
// read it makes anyway for a key with a hedge, breaker, throttler or
// limiter.
package slogobserver
