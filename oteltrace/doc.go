// Package oteltrace reports what resilix does to a call as events on the
// call's OpenTelemetry span.
//
// [New] returns a *policy.Observer; put it in transport.Config.Observer,
// alone or joined with others (policy.JoinObservers):
//
//	rt, err := transport.New(transport.Config{
//		Policies: set,
//		Observer: policy.JoinObservers(metrics, oteltrace.New()),
//	})
//
// Every resilix event carries the caller's request context, hedge legs'
// included. The Observer adds its events to the span in that context, the
// one trace.SpanFromContext returns: the span of whoever called
// RoundTrip. It creates no span and reads no global provider; it only
// uses go.opentelemetry.io/otel/trace. When the context holds no span, or
// one that does not record (not sampled, or already ended), it does
// nothing and allocates nothing.
//
// The span is best one per call: wrap the resilix transport in
// otelhttp.NewTransport, whose client span then holds one call's events
// and its resend count. With no span of its own per call, the events of
// every call made under one span (a server's request span, say) land on
// that span side by side, told apart by resilix.key, and each call with
// more than one wire attempt overwrites the resend count. To see every
// wire attempt as a span of its own as well, give resilix a base wrapped in
// otelhttp.NewTransport: its spans are children of the call's, since every
// attempt's context derives from the caller's.
//
// # Events
//
// Every event carries resilix.key, the transport's scope key (by default
// the request's canonical authority). Durations are float64 seconds.
//
//	event                     when                           attributes
//	resilix.attempt           a wire attempt ended           resilix.attempt.kind, resilix.attempt.number,
//	                                                         resilix.attempt.outcome, resilix.attempt.latency,
//	                                                         resilix.attempt.discarded,
//	                                                         http.response.status_code (a response came back),
//	                                                         error.message (an error did),
//	                                                         resilix.lane (with policy.Set.Replicas)
//	resilix.hedge.started     a hedge leg was sent           resilix.attempt.number, resilix.hedge.threshold
//	resilix.hedge.won         a hedge leg's response won     resilix.attempt.number, resilix.hedge.threshold
//	resilix.tie.cancelled     a tied leg was cancelled, its  resilix.attempt.number, resilix.hedge.threshold
//	                          twin having started first
//	resilix.tie.ran_twice     a second leg of a tied round   resilix.attempt.number, resilix.hedge.threshold
//	                          started
//	resilix.hedge.suppressed  a hedge was due, a gate        resilix.hedge.reason
//	                          stopped it
//	resilix.refused           an admission gate refused      resilix.attempt.kind, resilix.gate,
//	                          an attempt                     resilix.priority, resilix.tenant.heavy,
//	                                                         resilix.retry_after (when the gate gave a hint)
//	resilix.retry.skipped     a failed attempt was not       resilix.attempt.number (the failed one),
//	                          retried, attempts were left    resilix.retry.reason, resilix.gate (reason gate)
//	resilix.pushback          a 429 or 503 with Retry-After  http.response.status_code, resilix.retry_after
//	                          armed the throttler's pushback
//	resilix.header.malformed  a header could not be parsed   http.header (its name; never its value)
//	                          (or a tenant id not written)
//
// The values are the names the policy package gives them:
//
//   - resilix.attempt.kind: first, retry or hedge (policy.AttemptKind);
//   - resilix.attempt.number: the wire attempt's number within its call,
//     from 1, an int;
//   - resilix.attempt.outcome: success, failure, canceled, invalid for a
//     request net/http refused to send as it is, or discarded for the
//     loser of a hedge race, reported when resilix cancels it;
//     resilix.attempt.discarded is true exactly then;
//   - resilix.attempt.latency: from the dispatch to the base RoundTripper,
//     after the gates, to the response headers or the error;
//   - resilix.lane: the lane the attempt was sent on, for a key with
//     policy.Set.Replicas: the replica's address (host:port) for a lane of
//     Endpoints, or the lane's index, "0" to "63", for a connection lane
//     and for the lane that dials the request's own address until
//     Endpoints answers (policy.AttemptInfo.Lane); absent without
//     Replicas, and on a hedge leg discarded before it took a lane. A
//     retry or a hedge goes to a lane its call has not used yet, so the
//     lanes of a span's attempts show whether its second draw went to
//     another replica;
//   - resilix.hedge.threshold: the latency after which the hedge was sent;
//   - resilix.hedge.reason: warming, deadline, concurrency, priority,
//     health, value, budget, rejected, body_error, body_pending or
//     body_too_large (policy.SuppressReason);
//   - resilix.gate: throttler, breaker, limiter, bulkhead or rate_limit
//     (policy.Gate);
//   - resilix.priority: critical, degraded, best_effort or bulk;
//   - resilix.tenant.heavy: whether the request's tenant was above its
//     fair share when refused;
//   - resilix.retry_after: the refusal's hint, or on resilix.pushback the
//     answer's Retry-After, in seconds;
//   - resilix.retry.reason: not_replayable, deadline, budget, retry_after,
//     body_error, permanent or gate (policy.SkipReason).
//
// A refused hedge leg shows as resilix.refused and then
// resilix.hedge.suppressed with reason rejected; a refused retry as
// resilix.refused and then resilix.retry.skipped with reason gate.
//
// When a call has sent more than one wire attempt, retries and hedges
// together, the span gets http.request.resend_count, the OpenTelemetry
// semantic convention's attribute: an int, the wire attempts minus one.
// It is set when RoundTrip returns.
//
// A hedge leg cancelled as the loser is reported from its own goroutine,
// and may come after the call has returned. If the span has ended by then
// (otelhttp ends its span when the response body is closed or read to the
// end), the SDK drops the event.
//
// # Cost
//
// Without a recording span, each event costs a context lookup and no
// allocation. With one, each event builds its attributes and costs what
// the SDK's AddEvent costs. Any Observer with AttemptDone and CallDone,
// this one included, makes the transport time every attempt and the call
// (clock reads it makes anyway for a key with a hedge, breaker, throttler
// or limiter). go test -run '^$' -bench ObserverCost ./oteltrace compares
// a call with no Observer, with one whose funcs do nothing, and with this
// one, without a span and with a recording one.
package oteltrace
