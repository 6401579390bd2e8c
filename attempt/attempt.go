// Package attempt carries, from one service to the next, which wire attempt
// of its caller's call a request is: 1 for a first attempt, more for a
// retry or a hedge.
//
// It exists so that retries do not multiply across tiers. The Google SRE
// book (chapter 22, "Addressing Cascading Failures") counts what independent
// retries do: a first try and three retries at each of three layers make
// up to 4³ = 64 calls on the bottom one for one user request. A request that is itself a
// retry or a hedge has a caller that is already repeating the work, so the
// service serving it should not repeat its own calls as well: a resilix
// transport that finds a number above 1 in the call's context sends each of
// its calls once, neither retried nor hedged, and leaves its retry budget
// untouched. It does so on every key, whether or not the key propagates:
// what counts is how the request being served arrived. Envoy carries the
// same number in x-envoy-attempt-count and gRPC in
// grpc-previous-rpc-attempts.
//
// The number is one hop's. A transport with policy.Set.Propagate on writes
// on each wire attempt its own number, 1 for the first, so a call sent once
// for a retry arrives downstream as a first attempt; the admission package
// puts the number a request arrived with into its context. A server that
// uses neither can call With itself.
package attempt

import "context"

type key struct{}

// With returns a copy of ctx that carries n, the number of the wire attempt
// the request being served was: 1 for its caller's first attempt, 2 and up
// for a retry or a hedge. A number below 1 is stored as 1.
func With(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, key{}, max(n, 1))
}

// From returns the attempt number carried by ctx, and whether there was one.
func From(ctx context.Context) (int, bool) {
	n, ok := ctx.Value(key{}).(int)
	return n, ok
}

// Repeated reports whether ctx says the request being served is a retry or
// a hedge of its caller's call: a number above 1.
func Repeated(ctx context.Context) bool {
	n, _ := From(ctx)
	return n > 1
}
