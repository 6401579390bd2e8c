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
// Such a retry needs Retry (and Retry.If, when set, to ask for it),
// passes the gates, and needs a body it can replay. With Replicas, while
// a lane the call has not used is open (neither ejected nor held back by
// a Retry-After), it is sent there at once, with no backoff, draws no
// token from the budget, and is not counted against Attempts (the lanes
// bound it: each goes to one the call has not used): the retries and
// hedges after it have as many attempts left as before the attempt that
// never left. It cost the host nothing, and the replica that was not
// there says nothing of the others; gRPC's retry design (gRFC A6)
// likewise retries an RPC that never left the client outside its retry
// policy. Otherwise (every lane used or blocked, or no Replicas) it is a
// retry like any other: a wire attempt counted against Attempts, it
// draws a token, is not sent when none is left, and waits the backoff.
// Observer.AttemptDone reports it with Kind AttemptRetry and Reason
// RetryUnsent; CallInfo.WireAttempts and Report.WireAttempts count it.
// Hedges are unchanged: a request that may not be sent twice is never
// hedged, and a hedge leg that never left counts against Attempts.
//
// # What could not be sent
//
// A request that net/http refuses to send as it is is the caller's bug,
// and no outcome at all: the dependency never saw it (or never all of
// it), and sending it again gets the same refusal. Only these errors are
// such a refusal (anywhere in the chain errors.Unwrap follows), told by
// net/http's whole messages, since it exports no type for them:
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
//     forbids (Upgrade, Transfer-Encoding, Connection);
//   - a body that does not match the request's ContentLength: shorter or
//     longer over HTTP/1 (http: ContentLength=7 with Body length 0, what
//     a request sent again with its Body already read gives), longer over
//     HTTP/2, or a ContentLength with a nil Body.
//
// So is an attempt whose error is the one the caller's body returned as
// it was read or closed (the caller's reader, or its GetBody's): the
// transport sends a body whose reads may fail through a reader that
// keeps its error, which net/http returns as it is or wraps. (The
// in-memory bodies http.NewRequest makes, a *bytes.Buffer, *bytes.Reader
// or *strings.Reader, cannot fail, and are sent as they are.)
//
// Such an attempt is made once: it is not retried, whatever Attempts and
// the method allow, and no retry is reported skipped, since it is no
// failure; a hedged round ends as soon as it comes back, starting no
// hedge. Classify and Retry.If are not asked. No policy learns from it:
// the throttler, the breaker and the limiter release it as no evidence (a
// caller's bug cannot open the breaker for every caller of the host), nor
// does its lane (Replicas) count it, the latency window records nothing, and no budget token is drawn: the
// call takes back what it deposited, so that it earns other calls no
// retries.
// Observer.AttemptDone and Observer.CallDone report it with Outcome
// policy.Invalid, and the caller gets the error as net/http returned it,
// never wrapped.
//
// # A stall of the client
//
// A per-attempt timeout (policy.Timeout, or an Override's PerAttempt)
// that the client ended 20 ms or more after its deadline is the client's
// own stall, not the dependency's silence. A client whose process does
// not run for a while (a GC pause, CPU starvation, a SIGSTOP) ends every
// attempt whose deadline passed meanwhile at once, late by what is left
// of the stall, on every host it calls; an answer may have come in time
// and waited unread. Counted, 40 attempts in flight would make 40
// failures at once, enough to open a healthy host's breaker, or to have
// its throttler refuse calls. How late is measured for every attempt
// that timed out, from the deadline its timer was armed for (after any
// wait at a gate) to the moment its base returned; a runtime timer on a
// busy host fires a few milliseconds late at most, so a host that does
// not answer has its timeouts ended on time.
//
// Such a timeout teaches no policy anything, as a caller's cancellation
// does not: the breaker does not count it (nor does a half-open
// breaker's probe decide on it), the throttler withdraws it from its
// requests, the limiter learns no latency from it (the stall's latency
// is the client's, which no limit relieves), the hedge's latency window
// records nothing, and with Replicas its lane counts no failure, is not
// taken out and ejects nothing. The call goes on as for any timeout: the
// caller gets the attempt's error (policy.ErrAttemptTimeout), its
// retry's rules apply (Retry.If, Attempts, the budget, the backoff, the
// deadline), Observer.AttemptDone reports it with its outcome as
// classified and AttemptInfo.Stalled set, and Observer.CallDone and the
// Report as before. The rule needs a base that honours cancellation, as
// net/http does: one that returns long after its attempt's context is
// cancelled has its timeouts taken for the client's stall.
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
//     first value, unless Config.DistrustHeaders), as Priority.String
//     spells it, which
//     shedding.ParsePriority reads. A call that names no priority at all,
//     or whose header does not parse, sends none, rather than Critical,
//     this transport's default: the upstream then applies its own default
//     (admission.Config.DefaultPriority), which is its decision to make.
//   - Config.TenantHeader: the call's tenant id as the transport reads it
//     (the context's, tenant.With, else the request's header's first
//     value, unless Config.DistrustHeaders). An empty id is none: a
//     context holding the empty tenant, as admission puts there for an
//     untrusted caller, sends no tenant whatever the request's header
//     says. An id longer than MaxTenantLen (256 bytes), or one that
//     cannot be a header value (a control character, which would fail
//     the attempt in net/http), is not written, and is reported to
//     Observer.MalformedHeader, once a call.
//   - Config.TimeoutHeader: how long the attempt may still take, in whole
//     milliseconds rounded down: the time left before the caller's
//     deadline, or the attempt's per-attempt timeout (policy.Timeout, as
//     the call's Override narrows it) when that is shorter, measured as
//     the request is handed to Config.Base and, when Config.Base is an
//     *http.Transport, again once it has a connection for the request
//     (dialled, idle, or waited for under MaxConnsPerHost) and, when its
//     HTTP2 has StrictMaxConcurrentRequests, once it has a stream for it
//     (waited for on a connection at its stream limit), less a transit
//     margin of 5ms for the time it takes to reach the next tier and be
//     read there. A later wait, which net/http's trace hooks do not
//     show, is not taken off: an HTTP/2 request held for a stream
//     without StrictMaxConcurrentRequests (when the server lowers its
//     stream limit as requests are handed a connection). It is 0 when
//     no more than the margin is left, and written only when there is a
//     deadline or a per-attempt timeout. So the next tier's deadline (its
//     arrival plus the time announced) is 5 to 6ms earlier than the
//     caller's, less the transit, and later only when the transit takes
//     more than that: a network hop of more than 5ms, a server too busy
//     to read the request at once (docs/propagation.md measures it over
//     loopback).
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
// # Tied requests
//
// With policy.Hedge.Tied, a hedged round is tied where the key's servers
// say when a request starts (package admission does; see its "Tied
// requests"): each leg carries Resilix-Tie: 1, and its server answers it
// with a 103 carrying Resilix-Tie: started the moment a worker takes it,
// before the final answer. The round sends its twin (the hedge) after a
// short delay rather than after the quantile: twice the quickest signal
// seen over the last 10 to 20 s, the time the first leg would have taken
// to say it started had it not waited, and at least 1 ms. The first leg to
// say it started has every other leg of its round that has not said so
// cancelled, which its server then drops from its queue without running
// it; the round sends no more legs, and the leg that started is left to
// finish, as the one the call waits for. A twin is then a queue slot, not
// the work. It takes a budget token as it is sent, like any hedge, and
// gives it back when it is cancelled, provided it had been on its way for
// at least the ties' delay: long enough for its own signal to have come
// had its server started it at once. A twin cancelled sooner keeps its
// token, since it may have started unheard. Over HTTP/2 the cancellation
// resets the twin's stream; over HTTP/1.1 it closes the twin's connection,
// which costs the next request there a dial.
//
// A key learns whether its servers speak ties: until it has seen a
// signal, its rounds are hedged as usual and only their first legs are
// marked, so that learning costs no extra call; once three tied legs in a
// row are answered with a success but no signal (a server of another
// version took the upstream's place, or a proxy drops 1xx answers), it
// goes back to learning. Only a request that may be sent twice is ever
// marked, as only such a request is hedged. A leg accepts at most 5
// informational answers (a server sending more fails it, as net/http
// does when nobody reads them), and only a 103 whose one Resilix-Tie
// value is exactly "started" is a signal.
//
// Two legs that both start before either signal reaches the client run
// twice: Observer.TieRanTwice hears it when the second signal comes before
// the round is decided, and a leg cancelled after it started but before
// its signal arrived is seen only by its server (as a request whose caller
// went away while its handler ran). A twin its server started at once,
// cancelled because the first leg's signal came first (a server started
// both legs before that signal, delayed by the network or the client's
// scheduling, reached the client), is cancelled sooner than the ties'
// delay after it was sent and keeps its token: twins that run this way
// cost the budget what hedges that lose do, and are bounded by it. What
// the budget does not count is a twin that started after waiting in its
// queue for most of the delay, or whose signal takes longer than the
// delay, cancelled before its signal came. Observer.TieCancelled hears
// each leg cancelled because its twin started first, and HedgeStarted
// reports each twin with HedgeInfo.Tied.
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
