package policy

import (
	"context"
	"strconv"
	"time"
)

// Replicas sends a key's wire attempts over lanes, so that a host that is
// really a fleet (pods behind a Kubernetes Service, an address list in DNS)
// is treated as one. Each lane is a connection pool of its own, a clone of
// the transport's base *http.Transport, so TLS, timeouts and HTTP/2 are the
// base's: an address when Endpoints names the replicas, or one of
// Connections pools to the request's own address when it does not (behind
// an L4 balancer, which places each connection on a replica, each pool
// lands on replicas of its own, as gRPC's subchannels do). The zero
// Replicas is four connection lanes.
//
// Each attempt picks a lane by the power of two choices over peak-EWMA
// cost (Finagle's and Linkerd's): of two lanes drawn at random, the one
// with the lower (outstanding attempts + 1) × (latency estimate + failure
// penalty) wins; the penalty is kept apart from the estimate and fades
// within seconds. A lane nothing is known of (new in the set, back from an
// ejection, a hold or a refused dial, dialed anew) gets one attempt at a
// time until it answers, then ramps up to its share over 1 s (Envoy's slow
// start); so does a lane whose last attempt ended with no answer (a
// hedge leg lost) a second and 199 of its key's attempts ago: its
// estimate, what that silence said, is stale. A hedge or a retry picks a lane its call has not used yet
// (Envoy's previous_hosts) while one is left.
//
// A lane is ejected, not picked while another is left, for EjectFor × its
// count of ejections, at most MaxEjectFor, at most MaxEjected of the lanes
// at once (Envoy's outlier detection): after ConsecutiveFailures failures
// in a row; for a failure rate far above the other lanes' (the Breaker's
// relative rule, the other lanes as the baseline); or for answers far
// slower than the other lanes' at the same moments (EjectLatency; a lane
// of Endpoints is first taken out and probed, since a replica may be slow
// only for a queue that drains once the clients send elsewhere: for as
// long as its slow answers took, at most 1 s, then, slow again with no
// fast answer between, for 1 s; it is ejected when it is slow a third
// time, to attempts sent after that, with no fast answer between). The
// client's own stalls (a GC pause, CPU throttling) are taken out of every
// answer's time first, so they eject nothing. A refused or timed-out dial,
// or a Timeout.PerAttempt that meets no answer, takes the lane out for 1 s,
// then one probe, unless the client ended that timeout 20 ms or more
// after its deadline: its own process was stalled then, and every attempt
// whose deadline passed meanwhile ends at once, on every lane, which says
// nothing of any lane; a 503 or 429 with Retry-After holds back its lane, not
// the key, and counts towards no ejection. A connection lane that fails while another lane does not is
// dialed anew, so that a balancer places it again.
//
// The key's Breaker judges the host, not a replica: a failure its lane
// explains (the lane ejected, or failing while another lane open is not)
// is no evidence to it, so one bad replica of four never opens it; every
// lane failing opens it as it would without lanes.
//
// A lane lets its connections go, each closed once idle or when its last
// stream ends, when the lane is drained, ejected or dialed anew, or its key
// is forgotten (transport.Config.MaxKeys); Transport.CloseIdleConnections
// reaches them until then. Lanes cost no goroutine and no timer (a refresh
// of Endpoints runs on a goroutine a call starts), and about 1.5 KB a lane
// beyond its connections; each lane has the base's per-host limits. Each
// lane keeps its server's last load report (see LaneSnapshot.Load); a
// fresh one that says an attempt would queue there raises the lane's
// picking cost by that wait, and widens the pick to every lane (see
// LoadReportAge).
//
// Replicas needs a base that is an *http.Transport (transport.New says so
// otherwise). A base whose HTTP/2 was set up by
// golang.org/x/net/http2.ConfigureTransport may not keep its lanes' HTTP/2
// connections apart (its clones share the one http2.Transport it made):
// use net/http's own HTTP/2 (ForceAttemptHTTP2, or Transport.Protocols).
// docs/replicas.md has every rule with its numbers, and measured cases.
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
	// the lane out for a second), nor a 503 or 429 whose Retry-After held
	// the lane back (the hold is its penalty: the server's pushback says
	// how busy it is, not that it fails), nor a per-attempt timeout the
	// client ended 20 ms or more after its deadline (its own stall's). If zero, 5 is used. If negative, only the failure rate
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
	// to use it: a lane whose server's report that young leaves an
	// attempt no room under its limit costs its peak-EWMA cost times the
	// time the attempt would take there, its wait for a slot included,
	// and when the lane the two choices pick would queue the attempt, the
	// cheapest of every lane is picked; where the attempt finds room a
	// report changes nothing, and it never lowers a cost (see "Load
	// reports" in docs/replicas.md). If zero, 2 s is
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
	// than the other lanes' latency estimates; on a lane of Endpoints,
	// the third such run with no fast answer between (the first two
	// take it out, as LaneDown: for as long as the run's last answer
	// took, at most a second, then for a second).
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
	// LaneDown: the lane's dial was refused or timed out, its
	// attempt's own timeout met no answer: it is out for a second,
	// then probed. On a lane of Endpoints, also when its answers were
	// far slower than the other lanes' for the first or second time
	// since it last answered fast: out for as long as the last of them
	// took (at most a second), then for a second, then probed.
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
