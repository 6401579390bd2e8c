// Package otelmetrics reports what resilix does as OpenTelemetry metrics.
//
// [New] returns a *policy.Observer that records into a
// metric.MeterProvider; put it in transport.Config.Observer:
//
//	obs, err := otelmetrics.New(provider)
//	if err != nil { ... }
//	rt, err := transport.New(transport.Config{Policies: set, Observer: obs})
//
// [NewWith] takes [Options]: whether a lane is named by its address.
//
// One Observer may serve several transports: each attaches its state when
// it is built, and the gauges report the keys of all of them. The Observer
// does not keep a transport alive: one that is dropped (say, replaced on a
// configuration reload) is garbage collected, and its keys leave the
// gauges.
//
// # Instruments
//
// The meter is named "github.com/resilix/resilix/otelmetrics". Every
// measurement carries the attribute key, the transport's scope key
// (the request's canonical authority, lower case and without the
// scheme's default port, unless transport.Config.Key says otherwise).
//
//	name                            kind                  unit       attributes
//	resilix.calls                   int64 counter         {call}     key, outcome
//	resilix.attempts                int64 counter         {attempt}  key, kind, outcome
//	resilix.hedges                  int64 counter         {hedge}    key, outcome, reason
//	resilix.shed                    int64 counter         {attempt}  key, gate, priority
//	resilix.retries.skipped         int64 counter         {retry}    key, reason, gate
//	resilix.pushbacks               int64 counter         {response} key, http.response.status_code
//	resilix.headers.malformed       int64 counter         {header}   key, http.header
//	resilix.ejections               int64 counter         {ejection} key, reason
//	resilix.call.duration           float64 histogram     s          key, outcome
//	resilix.hedge.threshold         float64 histogram     s          key
//	resilix.hedge.threshold.current float64 gauge (async) s          key
//	resilix.breaker.state           int64 gauge (async)   {state}    key
//	resilix.limiter.limit           int64 gauge (async)   {request}  key
//	resilix.budget.balance          float64 gauge (async) {token}    key
//	resilix.rate_limit.store        int64 gauge (async)   {state}    key
//	resilix.repeats.sent_once       int64 counter (async) {call}     key
//	resilix.lanes                   int64 gauge (async)   {lane}     key, state
//	resilix.lane.attempts           int64 counter         {attempt}  key, lane, outcome
//	resilix.lane.state              int64 gauge (async)   {state}    key, lane
//	resilix.lane.load               float64 gauge (async) 1          key, lane
//	resilix.lane.load.age           float64 gauge (async) s          key, lane
//
// The attribute values are the names the policy package gives them:
//
//   - outcome on calls and call.duration: success, failure, canceled,
//     rejected or invalid (a request net/http refused to send as it is,
//     the caller's bug) (policy.Outcome);
//   - kind and outcome on attempts: first, retry or hedge
//     (policy.AttemptKind); success, failure, canceled, discarded (the
//     loser of a hedge race, counted when it is cancelled) or invalid;
//   - outcome on hedges: started, won, suppressed, tie_cancelled (a leg
//     of a tied round cancelled because another said it started first)
//     or tie_ran_twice (a second leg of a tied round said it started:
//     duplicate work), and, only on suppressed, reason: warming,
//     deadline, concurrency, priority, health, value, budget, rejected,
//     body_error, body_pending or body_too_large
//     (policy.SuppressReason). The hedge win rate is
//     hedges{outcome="won"} / hedges{outcome="started"};
//   - gate and priority on shed: every refusal of an attempt by an
//     admission gate, whichever gate it was (throttler, breaker, limiter,
//     bulkhead or rate_limit; policy.Gate) and the request's
//     priority (critical, degraded, best_effort, bulk). A server's
//     refusals (package admission, with this Observer in its Config) are
//     counted here too, with gate deadline or admission and the key
//     admission.Config.Name. Refused hedge legs
//     are included; they are also counted as hedges suppressed with reason
//     rejected. A call whose first attempt or retry is refused ends there,
//     as calls{outcome="rejected"};
//   - reason on retries.skipped: why a failed attempt was not retried
//     although the call had attempts left (policy.SkipReason):
//     not_replayable, deadline, budget, retry_after, body_error, permanent
//     or gate, and, only with gate, the gate that refused the retry. The
//     call returns its last attempt's response or error, and the caller
//     cannot tell it from a call whose attempts ran out;
//   - http.response.status_code on pushbacks: 429 or 503, the status of
//     each answer whose Retry-After armed or extended the throttler's
//     pushback (policy.Observer.Pushback). 429 paces the key's Bulk and
//     BestEffort calls, 503 stops them; the calls it holds back are
//     counted in resilix.shed with gate throttler;
//   - http.header on headers.malformed: the name of a header that could
//     not be parsed and was treated as absent (a priority, a Retry-After;
//     on a server, package admission's headers), or of the tenant header
//     a propagated tenant id could not be written to
//     (policy.Observer.MalformedHeader);
//   - reason on ejections: consecutive, rate or latency (policy.EjectionReason),
//     why a lane of a key with policy.Set.Replicas was ejected
//     (policy.Observer.LaneEjected): ConsecutiveFailures attempts in a
//     row failed on it, or its failure rate over an interval was far above
//     the other lanes';
//   - state on lanes: open or ejected, the lanes a key with
//     policy.Set.Replicas picks from (Snapshot.Lanes, lanes draining after
//     their address left not counted) that are not ejected, and those
//     that are (Snapshot.LanesEjected);
//   - lane on lane.attempts, lane.state, lane.load and lane.load.age:
//     the lane's index among its
//     key's lanes, "0" to "63" (policy.AttemptInfo.LaneIndex, the index of
//     Snapshot.PerLane), or, with Options.LaneAddresses, a lane of
//     Endpoints' address (policy.AttemptInfo.Lane); and outcome on
//     lane.attempts, as on attempts.
//
// resilix.lane.attempts counts the wire attempts of a key with
// policy.Set.Replicas on each of its lanes, and so gives each lane's share
// of its key's attempts, which is what picking gave it: a replica slow or
// failing gets a small share before anything is ejected. It is a counter
// of its own, rather than a lane attribute on resilix.attempts, which would
// multiply that counter's series by the lanes. resilix.lane.state is each
// lane's state (Snapshot.PerLane), the value of policy.LaneState: 1 open,
// 2 probing (nothing known of it, one attempt at a time until it answers),
// 3 held by a Retry-After, 4 down (its dial refused or timed out, or its
// attempt's timeout met no answer), 5 ejected. Together they tell which
// replica is bad, and, beside the hedge win rate, whether picking or
// hedging helped the tail.
//
// resilix.lane.load is the load each lane's server last reported in ORCA's
// endpoint-load-metrics header (admission writes it; so do vLLM and
// Triton, when asked), as Snapshot.PerLane's Load: a utilization, 1 at
// the server's limit, above 1 while its queue holds requests, at least 1
// when an attempt on the lane failed since the report; and
// resilix.lane.load.age is that report's age (LoadAge). Both have a point
// only for a lane whose server has sent a report. A load report older
// than 2 s is the server's word no more.
//
// The ejections and lanes instruments name no lane. The lane an attempt
// went to is also on its span event (package oteltrace, resilix.lane).
//
// resilix.repeats.sent_once counts, for the keys that retry or hedge, the
// calls sent once, without retry or hedge, because their request was
// itself a retry or a hedge of the caller's own call (package attempt;
// policy.Snapshot.RepeatsSentOnce). It restarts from zero when a key's
// state is evicted (transport.Config.MaxKeys), which a cumulative counter
// reports as a reset.
//
// resilix.lanes has both points, open and ejected, for every key with
// Replicas, so that the share ejected is
// lanes{state="ejected"} / sum of both.
//
// resilix.call.duration is a call's time from RoundTrip's start to its
// return (response headers or error), retries, backoff and hedges
// included. resilix.hedge.threshold records, once per hedge sent, the
// latency after which it was sent: the live quantile Hedge.Quantile of the
// key's recent latency. Being recorded only when a hedge is sent, it says
// nothing while no call is slow enough to be hedged;
// resilix.hedge.threshold.current, a gauge read at collection, is that
// quantile as it stands (policy.Snapshot.HedgeThreshold), for every key
// that hedges, and has no point while the key's latency window holds
// fewer than Hedge.MinSamples (the hedges then suppressed with reason
// warming).
//
// Both histograms advise these explicit bucket boundaries, in seconds, a
// 1-2.5-5 series from half a millisecond to 30 seconds that resolves both
// in-datacenter RPCs and slow third-party APIs (an SDK View,
// sdk/metric.NewView, can replace them):
//
//	0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30
//
// The gauges are read when the meter provider collects, from the state of
// every key each attached transport holds; a key that does not run the
// policy has no point. resilix.breaker.state is 0 when the breaker is
// closed, 1 when open, 2 when half-open and 3 while an operator has the
// key isolated (transport.Transport.Isolate; a key isolated without a
// Breaker has a point from then on, 0 once released), the values of
// policy.BreakerState. resilix.limiter.limit is the adaptive concurrency
// limit, resilix.budget.balance the tokens left in the retry-and-hedge
// budget (a retry or a hedge takes one, and is not sent when less than one
// is left). resilix.rate_limit.store is the state of the store of a shared
// rate limit (policy.RateLimit.Shared) as the key last saw it: 1 up, 2
// failing with calls going on under the local rate (FailOpen), 3 failing
// with calls refused (the values of policy.StoreState). If two attached
// transports hold the same key, the gauge shows only one of them.
//
// The budget deserves watching where failures are not random: the default
// budget (a fifth of the calls, plus 10 tokens a second; a retry that
// succeeds gets its token back) retries an upstream failing a steady 30%
// as fully as no budget does (2.7% of calls fail with Attempts 3, budget
// on or off: go test -run TestRetryBudgetEffect -v ./otelmetrics), but
// when most retries fail too, it stops them, and only
// retries.skipped{reason="budget"} and a balance below 1 say so.
//
// # Exemplars
//
// Every measurement of the counters and histograms is recorded with its
// event's Context, the caller's request context (a hedge leg's included),
// so an SDK that keeps exemplars links each point to a trace: with the
// SDK's default trace-based exemplar filter, a measurement made while the
// caller's span is sampled carries that span's trace and span ids. The
// gauges are observed at collection, outside any call, and carry none.
//
// # Prometheus names
//
// Through the OpenTelemetry Prometheus exporter the dots become
// underscores, counters gain _total and the histograms _seconds:
// resilix_calls_total, resilix_attempts_total, resilix_hedges_total,
// resilix_shed_total, resilix_retries_skipped_total,
// resilix_pushbacks_total, resilix_headers_malformed_total,
// resilix_ejections_total, resilix_repeats_sent_once_total,
// resilix_call_duration_seconds_bucket (_sum, _count),
// resilix_hedge_threshold_seconds_bucket,
// resilix_hedge_threshold_current_seconds, resilix_breaker_state,
// resilix_limiter_limit, resilix_budget_balance, resilix_rate_limit_store,
// resilix_lanes, resilix_lane_attempts_total, resilix_lane_state,
// resilix_lane_load_ratio, resilix_lane_load_age_seconds;
// the attribute http.header becomes the label http_header.
// The hedge win rate per
// key:
//
//	sum by (key) (rate(resilix_hedges_total{outcome="won"}[5m]))
//	  / sum by (key) (rate(resilix_hedges_total{outcome="started"}[5m]))
//
// # Cardinality
//
// The key attribute comes from the requests, so its values are bounded
// only by the transport: transport.Config.MaxKeys (1024 by default) bounds
// the keys whose state is held at once, and a key beyond it is forgotten.
// Metrics do not forget: a cumulative exporter, Prometheus's among them,
// keeps every series it has seen for the life of the process, so a client
// that calls many hosts over time accumulates series for hosts it no
// longer calls. The OpenTelemetry SDK's cardinality limit (2000 attribute
// sets per instrument by default, sdk/metric.WithCardinalityLimit) is the
// backstop: past it, new series are folded into one with the attribute
// otel.metric.overflow=true, totals stay right and the detail is lost.
// resilix.attempts can hold up to 15 series per key, so the default limit
// is reached around a hundred keys with every kind and outcome seen. A
// client of many hosts should map them to fewer keys with
// transport.Config.Key, or drop the key attribute with an SDK View whose
// AttributeFilter leaves it out.
//
// The lane attribute is bounded by the lanes a key has at once, at most
// 64: resilix.lane.state, resilix.lane.load and resilix.lane.load.age
// have a series per lane, resilix.lane.attempts one
// per lane and outcome seen (three or four in practice: success, failure,
// discarded, canceled), 12 to 16 for a key of four lanes. By index, a key's
// series stay those of its 64 indexes at most, whatever addresses its lanes
// have had. With Options.LaneAddresses, every address a lane has had stays
// a series of a cumulative exporter: set it where the addresses are few and
// fixed (a static list, hosts that keep theirs), not where replicas come
// and go with addresses of their own (pods behind a headless Service,
// rescheduled with new ones).
//
// # Cost
//
// The observer's funcs run on the caller's goroutine, on every call. The
// attribute sets, and the measurement options that carry them, are built
// once per combination of key and attribute values and then reused, so a
// warm event costs a lock-free map lookup, an atomic load and the SDK's own
// recording; an attempt on a lane adds an atomic load or two and one more
// recording, and no allocation. The cache holds at most 2048 keys (with
// the sets of each key's lanes, at most 64); when a new key would exceed
// that, it is emptied and refills with the keys still in use.
// Measurements stay exact past the bound; only the saving is lost until
// the cache is warm again.
package otelmetrics
