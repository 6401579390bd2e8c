package policy

import (
	"context"
	"strconv"
	"time"
)

// Replicas sends a key's wire attempts over lanes, so that a host that is
// really a fleet (pods behind a Kubernetes Service, an address list in DNS)
// is treated as one: each lane is a connection pool of its own, a clone of
// the transport's base *http.Transport, so TLS, timeouts and HTTP/2 are the
// base's.
//
// A lane is an address when Endpoints names the replicas, or one of
// Connections pools to the request's own address when it does not (behind
// an L4 balancer, which places each connection on a replica, each pool
// lands on replicas of its own, as gRPC's subchannels do).
//
// Each attempt picks a lane by the power of two choices over peak-EWMA
// cost (Finagle's and Linkerd's): two lanes drawn at random, the one with
// the lower (outstanding attempts + 1) × (latency estimate + failure
// penalty) wins. The estimate jumps to a slower answer at once (its time
// net of the client's own stalls: see the stall rule below), averages a
// faster one in, and decays towards faster ones with a 10 s time constant.
// Failures are kept out of it (failure accrual apart, as Finagle keeps
// it): a failure sets the lane's penalty to the slowest other lane's
// estimate (at least its own latency) times 2 to the power of its failures
// in a row (at most 30 s), which fades with a 1 s time constant and halves
// with each success, so a replica that is slow or fails fast gets little
// traffic before anything is ejected, and one that failed through a 2 s
// outage and then answers has its share back within 3 s. A lane nothing is
// known of (new in the set, back from an ejection, a hold or a refused
// dial, dialed anew) gets one attempt at a time until it answers
// (Finagle's probe), then ramps up to its share over 1 s (Envoy's slow
// start, from a tenth of its share). A hedge or a retry picks among the
// lanes its call has not used yet (Envoy's previous_hosts), and reuses one
// only when every lane has been tried; an ejected, held or down lane is
// picked only when no other is left.
//
// A lane is ejected (not picked while another lane is left) for EjectFor ×
// the number of times it has been ejected, at most MaxEjectFor (Envoy's
// outlier detection), when ConsecutiveFailures attempts on it failed in a
// row; when 5 of its answers, with no fast one between, each took 5 × the
// lowest typical latency (a moving average of answers over about 1 s) of
// the other lanes or more (EjectLatency: the picker alone cannot keep a
// slow replica's share small when two lanes drawn together are both on it,
// as behind an L4 balancer, where several connection lanes may land on one
// replica); or when, over a 10 s interval with at least 20 of its attempts
// and 20 of the others', its failure rate reached min(0.9, max(0.2, 3 ×
// the other lanes' rate)), the breaker's relative rule with the other
// lanes as the baseline. Each interval a lane spends unejected takes one
// off its count. At most MaxEjected of the lanes are ejected at once, and
// never the last one; when a refresh shrinks the set, the bound holds on
// the new set, and the lanes ejected longest ago return first. An ejected
// lane gets traffic again when its time is up, one probe at a time until
// it answers, then a slow start; its connections are closed as they fall
// idle, so it comes back on a fresh one, which a balancer places anew.
//
// The stall rule: a lane is judged against the other lanes at the same
// moments. The key's gaps (stretches of 8 × its mean time between answers
// or more in which none came though some were in flight) are taken out of
// each answer's time before it is sampled or judged: a stall of the
// client's own process (a GC pause, CPU throttling, a VM's steal time)
// slows every answer that straddles it and ends none while it lasts. A
// slow answer then counts towards EjectLatency only when another lane's
// answer, sent after it, came back before it at least 5 times faster (or
// when no other lane had an attempt in flight while it was awaited:
// nothing to compare it with); the burst of calls queued in the client
// after a stall slows them in the order they were sent, so none overtakes
// another. A slow replica has the others answer fast while it is awaited.
//
// A replica that is not there is out at once: an attempt whose dial was
// refused or timed out takes its lane out for 1 s, then the next call
// that draws it may send it one probe, and it returns when it answers. It
// is not an ejection: it counts neither towards ConsecutiveFailures nor
// against MaxEjected, and EjectFor's longer ejections stay for replicas
// that answer badly. It also asks Endpoints again early, at most once a
// second a key. An attempt that Timeout.PerAttempt ends with no answer at
// all (a frozen or hung replica) takes its lane out for 1 s the same way,
// then a probe; it counts towards ConsecutiveFailures. A 503 or 429 with a Retry-After from one lane holds that
// lane back, not the key: the Throttler's pushback is armed only when no
// other lane is left. The lane is tried again by one probe as soon as the
// hold could be over: a second before the Retry-After ends (it counts
// whole seconds), at most MaxEjectFor.
//
// A connection lane that fails twice in a row while another lane is not
// known to fail (a failure the key's Breaker does not learn, below) is
// dialed anew: its idle connections are closed before its attempts until
// one succeeds, so that a balancer places it again, and it is picked as a
// lane nothing is known of (one probe at a time) until it answers; its
// failures in a row still count towards its ejection. Behind an L4
// balancer a lane is where its connections landed: otherwise a client
// whose lanes landed three of four on one bad replica keeps them there
// while their connections live. In make replicas' 3-half-503 case over
// l4/h1 and haproxy/h1, the replica failing half its calls gives 2-4% of
// the answers.
//
// Over HTTP/1.1 a connection lane is a pool of as many connections as it
// has attempts in flight, each placed by the balancer on a replica of its
// own, so a lane may be a blend of replicas, and a hedge's loser, which
// net/http cancels by closing its connection, has its lane dial anew, on
// a replica drawn again. Lanes are not limited to one connection each:
// that would make each one replica, but cap a key's attempts in flight
// at Connections, and behind an L4 balancer it changed nothing the
// latency rule had not already done: on make replicas' l4 and haproxy
// paths a 20× slower replica answers under 0.5% of calls either way, as
// over h2c, where a lane is one connection.
//
// The key's Breaker judges the host, not a replica: a failure on a lane
// that is ejected, or that is failing (two failures in a row on it, a
// Retry-After that held it, or a refused dial), while another lane open
// is not known to fail (its last outcome a success, or none yet), is
// released to the breaker as no evidence, so one bad replica of four
// never opens it, while every lane failing, or the last lane open
// failing, opens it as it would without lanes; a half-open breaker's
// probe is always evidence.
//
// A lane lets its connections go when it is drained, ejected or dialed
// anew, and when its key is forgotten (transport.Config.MaxKeys): each
// of its connections is then closed, at once if idle, else once its own
// last stream ends (an HTTP/2 body read to the end or closed; an HTTP/1
// connection as it falls idle), whatever streams other connections of
// the lane still have open, over HTTP/2 as over HTTP/1.1, never left to
// the base's IdleConnTimeout, and
// the lane's next attempt goes out on a clone made anew, which dials: an
// ejected lane comes back on a new connection, which a balancer places
// anew. Transport.CloseIdleConnections reaches the clones let go until
// they are closed. Seeing an HTTP/2 stream end costs one small wrapper of
// its body (one allocation a call).
//
// Lanes cost no goroutine and no timer: ejections end and refreshes fall
// due lazily, from the time of the calls; a refresh runs on a goroutine
// of its own, started by the call that found it due, and ends with
// Resolve. A key's lanes cost about 1.5 KB a lane beyond its
// connections (the key's share included), 900 bytes of which are the
// lane's clone of the base (go test -run '^$' -bench ScopeMemory
// -benchtime=1x ./transport: 6.2 KB a key with four connection lanes,
// 6.4 KB with four of Endpoints), and a pool holds connections only
// while in use or idle (the
// base's IdleConnTimeout). Each lane has the base's per-host limits
// (MaxConnsPerHost, MaxIdleConnsPerHost), so a key holds at most the
// lanes times those.
//
// Each lane keeps the last load report its server sent on an answer
// (ORCA's endpoint-load-metrics header in TEXT form, as admission writes
// it, and vLLM and Triton when asked), with its time: see
// LaneSnapshot.Load. A malformed report (longer than 512 bytes, a field
// read twice, a value negative, NaN, infinite, not a plain decimal or
// out of its bound) is ignored and counted as a MalformedHeader; one
// older than 2 s no longer counts; a failure on the lane at or after a
// report makes its load at least 1. Picking does not use the reports yet,
// and the transport does not ask for them.
//
// Replicas needs a base that is an *http.Transport (transport.New says so
// otherwise); each lane is its Clone. A base whose HTTP/2 was set up by
// golang.org/x/net/http2.ConfigureTransport may not keep its lanes'
// HTTP/2 connections apart (its clones hand them to the one
// http2.Transport it made): use net/http's own HTTP/2 (the default with
// ForceAttemptHTTP2, or Transport.Protocols). The zero Replicas is four
// connection lanes.
type Replicas struct {
	// Endpoints resolves a request's host and port to the addresses of
	// its replicas, one lane each. If nil, lanes are Connections pools to
	// the request's own address.
	//
	// It is asked in the background, never on a call's path: by the first
	// call of a key, then by the first call that finds its answer older
	// than Refresh; one question at a time per key. Until the first good
	// answer, calls go to the request's own address, dialed with the
	// base's dialer (and so the system's resolver); when that dial fails,
	// Endpoints is asked for the address, on the call's path and within
	// its context, and its answer dialed in order, the first that
	// answers: a name only Endpoints knows (a cluster's DNS server, see
	// transport.DNSWith) is reached from the first call. A failed or empty
	// answer keeps the last good set (a failed first one is asked again
	// after 1 s, doubling up to Refresh). A lane whose address left the
	// set is drained: its attempts in flight finish, its idle connections
	// are closed.
	//
	// An address lane dials its address in place of the request's, with
	// the base's DialContext (or Dial, or DialTLSContext for TLS it does
	// itself): the Host header and the TLS server name stay the
	// request's, so a replica must still prove it is the host. The base's
	// Proxy is not used for it, nor for the calls before the first answer:
	// a proxy would pick the replica itself.
	Endpoints Resolver

	// Connections is the number of lanes without Endpoints. If zero, 4 is
	// used. At most 64.
	Connections int

	// Refresh is how old Endpoints' answer may grow before a call asks
	// again (Envoy's dns_refresh_rate). If zero, 5 s is used. A refused
	// or timed-out dial on a lane asks sooner, at most once a second.
	Refresh time.Duration

	// MaxEjected is the share of lanes that may be ejected at once, in
	// [0, 1]: with 4 lanes and 0.5, two; at least one of two or more
	// lanes may always be, and never all of them. If zero, 0.5 is used.
	// If negative, no lane is ever ejected.
	MaxEjected float64

	// ConsecutiveFailures ejects a lane on which that many attempts in a
	// row failed; a refused or timed-out dial is not counted (it takes
	// the lane out for a second). If zero, 5 is used. If negative, only the failure rate
	// ejects. With connection lanes keep it on: a connection lane failing
	// alone starts over on a new connection, with a new lane's record,
	// until it succeeds, and its failures in a row are what ejects it
	// when every new connection lands on a failing replica.
	ConsecutiveFailures int

	// EjectFor is how long a lane's first ejection lasts; each further one
	// lasts EjectFor more. If zero, 30 s is used.
	EjectFor time.Duration

	// MaxEjectFor bounds an ejection, and a lane's Retry-After hold. If
	// zero, 300 s is used.
	MaxEjectFor time.Duration

	// LoadReportAge is how old a lane's load report may be for picking
	// to use it: a lane whose server's report that young says a queue
	// above its limit costs its peak-EWMA cost times the wait that queue
	// adds; under the limit a report changes nothing, and it never lowers
	// a cost (see "Load reports" in docs/replicas.md). If zero, 2 s is
	// used. If negative, picking uses no report, and attempts do not ask
	// for them; reports are still read, for Measured and the metrics.
	LoadReportAge time.Duration
}

// Resolver returns the addresses of a host's replicas.
//
// hostport is the request's host and port, the scheme's default port
// filled in: "api.example.com:443". The answer is host:port addresses,
// one lane each; past 64 the rest are ignored (and counted in
// Snapshot.LanesIgnored). Resolve is called from a goroutine of its own,
// with a context that ends after Refresh; it must be safe for concurrent
// use, and must not panic: nobody is there to recover it.
type Resolver interface {
	Resolve(ctx context.Context, hostport string) ([]string, error)
}

// MaxLanes is the most lanes a key has.
const MaxLanes = 64

func (r *Replicas) validate() error {
	return joinErrs(
		fieldErrIf(r.Connections < 0 || r.Connections > MaxLanes, "Replicas.Connections", "must be in [0, %d], got %d", MaxLanes, r.Connections),
		fieldErrIf(r.Refresh < 0, "Replicas.Refresh", "must be >= 0, got %v", r.Refresh),
		fieldErrIf(r.MaxEjected > 1 || r.MaxEjected != r.MaxEjected, "Replicas.MaxEjected", "must be <= 1, got %v", r.MaxEjected),
		fieldErrIf(r.EjectFor < 0, "Replicas.EjectFor", "must be >= 0, got %v", r.EjectFor),
		fieldErrIf(r.MaxEjectFor < 0, "Replicas.MaxEjectFor", "must be >= 0, got %v", r.MaxEjectFor),
		fieldErrIf(r.EjectFor > 0 && r.MaxEjectFor > 0 && r.EjectFor > r.MaxEjectFor,
			"Replicas.EjectFor", "(%v) must be <= MaxEjectFor (%v)", r.EjectFor, r.MaxEjectFor),
	)
}

// WithDefaults returns r with every zero field set to its default.
func (r Replicas) WithDefaults() Replicas {
	r.Connections = or(r.Connections, 4)
	r.Refresh = or(r.Refresh, 5*time.Second)
	r.MaxEjected = or(r.MaxEjected, 0.5)
	r.ConsecutiveFailures = or(r.ConsecutiveFailures, 5)
	r.EjectFor = or(r.EjectFor, 30*time.Second)
	r.MaxEjectFor = or(r.MaxEjectFor, 300*time.Second)
	r.LoadReportAge = or(r.LoadReportAge, 2*time.Second)
	if r.EjectFor > r.MaxEjectFor {
		r.MaxEjectFor = r.EjectFor // only MaxEjectFor's default is below it
	}
	return r
}

// EjectionReason says why a lane was ejected (see Replicas).
type EjectionReason uint8

const (
	// EjectConsecutive: ConsecutiveFailures attempts in a row failed on
	// the lane.
	EjectConsecutive EjectionReason = iota + 1
	// EjectRate: over an interval, the lane's failure rate was far above
	// the other lanes'.
	EjectRate
	// EjectLatency: the lane's answers in a row were each far slower
	// than the other lanes' latency estimates.
	EjectLatency
)

var ejectionReasonNames = [...]string{"", "consecutive", "rate", "latency"}

// String returns "consecutive", "rate" or "latency".
func (r EjectionReason) String() string {
	return enumName(ejectionReasonNames[:], int(r), "ejection_reason")
}

// LaneState is the state of one lane of a key (see Replicas), as
// Snapshot.PerLane reports it. The zero LaneState is no lane.
type LaneState uint8

const (
	// LaneOpen: the lane is picked by its cost, as any lane with an
	// answer is.
	LaneOpen LaneState = iota + 1
	// LaneProbing: nothing is known of the lane (new in the set, back
	// from an ejection, a hold or a refused dial, dialed anew, or it has
	// only failed since): it gets one attempt at a time until it answers.
	LaneProbing
	// LaneHeld: a 503 or 429 with Retry-After from the lane holds it
	// back; it is picked only when no other lane is left.
	LaneHeld
	// LaneDown: the lane's dial was refused or timed out, or its
	// attempt's own timeout met no answer: it is out for a second, then
	// probed.
	LaneDown
	// LaneEjected: the lane is ejected (see EjectionReason), and picked
	// only when no other lane is left.
	LaneEjected
)

var laneStateNames = [...]string{"", "open", "probing", "held", "down", "ejected"}

// String returns "open", "probing", "held", "down" or "ejected".
func (s LaneState) String() string { return enumName(laneStateNames[:], int(s), "lane_state") }

// LaneSnapshot is one lane of a key, read at one instant (see
// Snapshot.PerLane).
type LaneSnapshot struct {
	// State is the lane's state; zero when there is no lane.
	State LaneState
	// Addr is the lane's address with Replicas.Endpoints, "" for a
	// connection lane and for the lane that dials the request's own
	// address until Endpoints answers.
	Addr string

	// HasLoad is true once the lane's server has sent a load report
	// (ORCA's endpoint-load-metrics header in TEXT form, as admission
	// writes it; see Replicas). Load is the load of its last report as a
	// utilization, 1 at the server's limit: resilix's (requests in flight
	// + queued) / limit, else application_utilization, else vLLM's KV
	// cache share, else cpu_utilization; at least 1 when an attempt on
	// the lane failed since that report came. LoadAge is the report's
	// age; one older than 2 s is the server's word no more, and the lane
	// is judged by the client's own estimate.
	HasLoad bool
	Load    float64
	LoadAge time.Duration
}

// LaneName is the name of a key's lane, as AttemptInfo.Lane and the
// observers give it: its address with Replicas.Endpoints, or, for a
// connection lane (no address), its index, "0" to "63".
func LaneName(addr string, index int) string {
	if addr != "" {
		return addr
	}
	return strconv.Itoa(index) // below 100: strconv allocates nothing
}

// LaneEjection describes a lane of a key ejected, or back from an
// ejection (see Replicas).
type LaneEjection struct {
	// Context is the context of the call whose attempt ejected the lane,
	// or, for a return, whose attempt was the lane's first after it.
	// Never nil.
	Context context.Context
	Key     string
	// Addr is the lane's address with Replicas.Endpoints, "" for a
	// connection lane; Index is the lane's slot among the key's lanes,
	// in [0, MaxLanes), which names a connection lane. Both are bounded:
	// at most MaxLanes a key at once.
	Addr   string
	Index  int
	Reason EjectionReason
	// For is how long the ejection lasts: EjectFor × the lane's count of
	// ejections, at most MaxEjectFor.
	For time.Duration
}
