// Package admission is resilix's server side: an http.Handler middleware
// that reads what a resilix client sends about a request (its priority,
// its tenant, the time its caller will still wait, which attempt it is)
// into the request's context, refuses work that cannot finish before
// starting it, and admits the rest through the same adaptive concurrency
// limiter the client uses, with the same bottom-up shedding by priority
// and the same fairness between tenants.
//
//	h, err := admission.Handler(mux, admission.Config{
//		// Trust callers with a client certificate your tls.Config verified
//		// against your internal CA (ClientCAs).
//		Trust: func(r *http.Request) bool { return r.TLS != nil && len(r.TLS.VerifiedChains) > 0 },
//	})
//	if err != nil { ... }
//	http.ListenAndServe(addr, h)
//
// Overload is a conversation between tiers (Google's SRE book, chapters 21
// and 22): the caller says how much a request matters and how long it will
// wait, and the server sheds what matters least and never starts what
// nobody will wait for. A transport built with policy.Set.Propagate sends
// the headers below on every wire attempt; admission reads them back, so
// that next, and any resilix transport it calls through, inherits the
// priority, the tenant and the deadline without a line of glue.
//
// # What it reads
//
//	header (default name)   read into                       from whom
//	Resilix-Priority        shedding.WithPriority           trusted callers only
//	Resilix-Tenant          tenant.With                     trusted callers only
//	Resilix-Timeout-Ms      a context deadline for next     any caller
//	Resilix-Attempt         attempt.With                    any caller
//
// Each name is configurable; the defaults are the transport's. A value
// the request's context already carries (put there by a middleware in
// front of admission, say from the caller's authenticated identity) wins
// over the header, as it does in the transport. Only the first value of a
// header is read. A name is matched in any spelling, as a server reading
// the wire would match it: a request built in-process may hold
// h["resilix-tenant"], which Go's server would have made Resilix-Tenant;
// the canonical spelling's value is read first.
//
// Priority and tenant are the caller's word about itself, honoured only
// when Config.Trust says so: an untrusted caller cannot raise its own
// priority, nor name a tenant (it could name a new one on every request
// and always look light, or name another's and have it shed). Its
// requests, and a trusted caller's that carry no priority, get
// Config.DefaultPriority (Critical unless set). The priority is always put
// in the context, and so is an empty tenant when an untrusted caller sent
// one, so that a transport inside next never falls back to reading the
// headers of an outgoing request that copied the incoming ones (a reverse
// proxy). The timeout and the attempt number are honoured from anyone: a
// caller can only shorten its own deadline, and only spare the server
// retries.
//
// The request next gets carries only those of the four headers whose
// value admission took, all the others' values removed, under every
// spelling of their names: a priority or a tenant from an untrusted
// caller, or that the request's context overrides; a priority, a timeout
// or an attempt number that cannot be read; an attempt number the context
// overrides. So a transport behind
// next, a reverse proxy's with policy.Set.Propagate or without, cannot
// forward an outside caller's word about itself to a service that trusts
// this one. The caller's own request keeps its headers: next gets a copy.
//
// The timeout is a whole number of milliseconds the caller will still
// wait, counted from the request's arrival (when ServeHTTP is called; the
// transit time is the caller's to subtract: a resilix transport takes a
// millisecond off for it). It becomes a deadline on
// next's context, unless that context already has an earlier one. The
// attempt number is 1 for a caller's first wire attempt and more for a
// retry or a hedge; a resilix transport inside next that finds a number
// above 1 sends each of its calls once, neither retried nor hedged, so
// that retries do not multiply across tiers (see package attempt).
//
// A value that cannot be read is treated as absent and reported to
// Observer.MalformedHeader (and counted in the Snapshot that
// Observer.Attach's source gives): a trusted caller's priority that
// shedding.ParsePriority rejects, or longer than 32 bytes (an untrusted
// caller's is not read at all); a timeout that is not a whole number of
// milliseconds (ASCII digits, surrounding white space ignored), or above
// one day; an attempt number that is not a whole number from 1 to
// 2³¹ − 1. Parsing allocates nothing, whatever a header holds: a 1 MB value
// costs the time to scan it and no memory, and the value an Observer is
// given is a copy of at most its first 64 bytes.
//
// # What it refuses
//
// A request whose time has run out at arrival (a timeout of 0, or an
// earlier deadline on its context that has passed), or whose time left is
// below Config.MinTimeout, is refused without calling next: work that
// cannot finish is not started. So is one whose time runs out while it
// waits in the limiter's queue (the wait ends then), or that leaves the
// queue with less than MinTimeout left.
//
// Every other request passes the limiter a transport runs for a
// policy.Limiter, configured by Config.Limiter: a
// concurrency limit learned from the handler's own latency (gradient
// family, with each shrink on trial), a priority queue of
// ceil(QueueFactor × limit) places, shedding before queueing under
// pressure, Bulk first, then BestEffort, then Degraded, and Critical only
// when the queue is full; within a priority, the tenant furthest above its
// fair share first. The limit is on requests inside next, the latency it
// learns from is next's time to completion (from admission to ServeHTTP's
// return, so the queue's wait is not learned, and a response written to a
// slow reader is), and the outcome it learns is:
//
//   - next returned with its context still live: a Success, or a Failure
//     when it answered with a status policy.DefaultClassify calls a
//     failure (5xx but 501, 429, 408; nothing written is a 200);
//   - its deadline passed first: a Failure, a slow sample (it took at
//     least that long; the limiter takes it as at least its baseline), as
//     a per-attempt timeout is on the client;
//   - its context was cancelled (the client went away), it hijacked the
//     connection, or it panicked: Canceled, which teaches nothing.
//
// A refusal is answered, without calling next, with a short text/plain
// body naming the reason and reported to Observer.Refused with Key
// Config.Name:
//
//	status  Retry-After  gate            when
//	503     yes          GateAdmission   the limiter is full: its queue holds no one this request outranks
//	429     yes          GateAdmission   shed or evicted for a higher priority, or a tenant above its fair share
//	504     no           GateDeadline    the time ran out or is below MinTimeout
//
// 503 says the server is overloaded for everyone who asks. 429 says that
// this request's priority, or its tenant, is over what the server can give
// it now, while requests of higher priority or of lighter tenants are
// still admitted: a Bulk request shed bottom-up gets 429, as does a
// tenant above its fair share (a tenant is only ever above its fair share
// when others are below it). A resilix client takes both, with their
// Retry-After, as the server's pushback (see
// policy.Throttler). Retry-After is the limiter's estimate of the
// wait for a free slot: the queue ahead and the refused request, served
// limit at a time at the handler's baseline latency, in whole seconds
// rounded up (HTTP's unit), at least 1. Beside it, Resilix-Retry-After-Ms
// says the same estimate in whole milliseconds, rounded up, at least 1,
// which whole seconds cannot say below 1 s; it is absent while the limiter
// has no baseline to estimate from. A resilix transport with Replicas
// holds back the replica that answered for that long when it is shorter
// than Retry-After, and reads it for nothing else. A deadline refusal is 504 Gateway
// Timeout, with no Retry-After: it says the caller's deadline is too
// close, not that the server is overloaded, and arms no pushback. The
// client has usually gone by then; if it has not, it learns why. A
// request whose client went away while it waited in the queue is not a
// refusal: it is answered 499, nginx's "client closed request", for the
// access logs, and not reported.
//
// The RejectedError a Refusal carries matches policy.ErrRejected and, for
// GateAdmission, policy.ErrShed; for GateDeadline, context.DeadlineExceeded.
// Its Kind is AttemptFirst, or AttemptRetry for a request that arrived as
// a repeat (an attempt number above 1, retry or hedge: the header does not
// tell them apart).
//
// # What it reports
//
// To the callers it trusts (Config.LoadReports), every answer, refusals
// included, carries the server's load in ORCA's header, endpoint-load-metrics,
// in its TEXT form (xds.data.orca.v3.OrcaLoadReport flattened into
// key-value pairs; see github.com/cncf/xds and Envoy's orca_parser):
//
//	endpoint-load-metrics: TEXT application_utilization=0.450,rps_fractional=310.5,named_metrics.resilix_in_flight=9,named_metrics.resilix_limit=20,named_metrics.resilix_queued=0
//
// application_utilization is the requests in flight over the limit, and
// rps_fractional the requests next finished over the last second (a
// sliding window), ORCA's standard fields; what ORCA has no field for is
// under named_metrics (a key it does not know makes Envoy reject the
// whole report): resilix_in_flight, the requests inside next, the one
// answered among them; resilix_limit, the concurrency limit;
// resilix_queued, the requests waiting for a slot. The header is written
// as the answer's headers go out (the first status of 200 or more, the
// first write or flush, or next's return having written nothing), so it
// says the load at that moment; a handler that wrote
// endpoint-load-metrics itself keeps its own. A resilix transport with
// policy.Replicas reads it per replica.
//
// # Tied requests
//
// A request marked as tied (Resilix-Tie: 1, which a resilix transport
// writes on each leg of a tied round, a request sent to two replicas at
// once) is told when next takes it: the moment it leaves the queue, or at
// once if it did not wait, the server sends an informational answer
//
//	HTTP/1.1 103 Early Hints
//	Resilix-Tie: started
//
// and then next's answer as usual, which does not carry the header. The
// caller's transport, on the first such signal of a round, cancels the
// round's other legs, which are then still waiting in their replicas'
// queues: each leaves its queue without reaching next, as any request
// whose caller went away does (answered 499 to nobody, no refusal, no
// evidence for the limiter). Over HTTP/2 the cancellation is a stream
// reset, and the connection serves on; over HTTP/1.1 the client closes
// the twin's connection, which costs the next request there a new dial.
// A mark other than "1" is reported as a malformed header and ignored; a
// client of HTTP/1.0, which cannot be sent a 1xx, is told nothing.
//
// The signal goes to every caller that marks its request, unless
// Config.NoTies is set: it costs the server one small write per tied
// request, and tells the caller only when its request started, which the
// first byte of the answer tells it anyway a service time later.
//
// The 103 is written on the ResponseWriter admission is given, so that
// writer must be able to send a 1xx: net/http's is, over HTTP/1.1 and
// HTTP/2. A wrapper outside admission that takes the first WriteHeader for
// the final status, as http.TimeoutHandler, httptest.ResponseRecorder and
// many logging middlewares do, would answer a tied request with a bare
// 103: put admission outside such wrappers (they still see next's answer
// as before), or set NoTies.
//
// # What it holds
//
// A request holds a slot of the limit from admission until next returns,
// panic included: a panic in next (http.ErrAbortHandler too) releases the
// slot and goes on unrecovered, to net/http's own handling. Memory is
// fixed whatever arrives: the limiter's per-priority mix and its tenant
// tracker (a Space-Saving summary of fixed capacity, allocated on the
// first request that names a tenant) do not grow with the number of
// distinct tenant ids, and nothing is kept per request after it ends.
//
// Observer.LimitTransition hears each move of the limit, and
// Observer.Attach receives a policy.StateSource that reports one key,
// Config.Name, with the limiter's limit, in-flight count, queue and
// pressure, and the malformed headers counted, so that otelmetrics reports
// resilix.limiter.limit for the server as it does for a transport's keys.
// The source does not keep the handler alive.
//
// The handler is safe for concurrent use and starts no goroutine. It
// allocates three small objects per request (the priority's context, the
// request copy next gets, the writer that records its status), one or two
// more for each value it puts in the context, a context and its timer
// for a deadline, a copy of the request's Header when it removes one
// of the four, and two for a load report (its value and its slice).
package admission
