// Package benchmarks compares resilix with the Go libraries it is most
// often weighed against, failsafe-go (with failsafehttp) and
// go-retryablehttp, on the same upstreams and loads.
//
// It is its own module, so that users of resilix never download a peer.
// Everything is in tests and benchmarks; see README.md for how to run them
// and what was measured.
package benchmarks
