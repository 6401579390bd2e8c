// Package estimator holds the windowed statistics the resilience policies
// decide from: a latency histogram that answers quantiles ([LatencyWindow])
// and a set of windowed counters ([Counters]).
//
// Both keep a sliding window as four rings, each covering one slice of a
// quarter of the window and stamped with the epoch (slice number) it
// holds. Nothing ever runs on a timer: a writer that finds its ring stamped
// with an old epoch claims and clears it, and a reader counts only the rings
// stamped with one of the last four epochs, so a ring nobody cleared still
// counts as empty. An idle window costs nothing and, once its rings are
// stale, reports nothing.
//
// Every method takes the current time as a parameter, so callers read the
// clock once per call and tests drive the window with fixed instants.
package estimator
