// Package httptestutil provides upstreams for testing HTTP clients against
// slow and failing dependencies.
//
// An [Upstream] is an [http.Handler] with a configurable latency
// distribution ([Constant], [Uniform], [Bimodal], [LogNormal], [Mix]) and
// configurable faults ([Fault]: error statuses with a probability,
// Retry-After, connection resets, slow headers, slow bodies). It counts
// arrivals per method, requests in flight and the peak in flight, and can
// enforce a fixed capacity, refusing the excess with 503 or, with
// Options.Queue, queueing it as a server with a fixed pool of workers does.
// The latency and the faults can be switched while it serves
// ([Upstream.SetLatency], [Upstream.SetFaults]) to simulate a brownout.
//
// An Upstream can be served two ways:
//
//   - over loopback, as any handler: httptest.NewServer(u);
//   - in memory, through [Upstream.RoundTripper] (or [InMemory] for any
//     handler), which calls the handler in-process without sockets. The
//     in-memory backend works inside [testing/synctest] bubbles, where the
//     latencies are honoured exactly in virtual time.
//
// Two handlers go in front of any other to push back as real servers do:
// [RateLimit], a token bucket that keeps admitting its rate and answers
// the excess with 429 and Retry-After, as an API's rate limit does, and
// [Overload], which answers everything with 503 and Retry-After for as
// long as it is overloaded.
//
// On the client side, [Track] wraps any [http.RoundTripper] and counts the
// responses it handed out and how many of their bodies were closed, which is
// how tests find response-body leaks; [Tracker.Wait] waits for the round
// trips a client left running after its call returned, such as hedge
// losers, so that a test in a bubble ends with none of them asleep.
//
// Randomness comes from a PCG source seeded with [Options.Seed], so the same
// seed and the same arrival order give the same latencies and faults.
package httptestutil
