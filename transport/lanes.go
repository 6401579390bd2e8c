package transport

import (
	"context"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// lanes is a key's lanes, each with a pool of its own (see lanePool).
type lanes = lane.Set[*lanePool]

// newLanes returns the lanes of a key whose chain has Replicas on. While
// Endpoints has not answered, the lane to the request's own address dials
// through it.
func (t *Transport) newLanes(r *policy.Replicas, now time.Time) *lanes {
	base := t.base.(*http.Transport) // New checked
	return lane.New(*r, now, func(addr string, _ int) *lanePool {
		var resolve policy.Resolver
		if addr == "" {
			resolve = r.Endpoints
		}
		return newLanePool(base, addr, resolve, &t.let)
	})
}

// takeLane picks the lane leg l is sent on, among those its call has not
// used yet, and returns its pool; it starts a refresh of the key's
// Endpoints in the background if one is due. A lane placed anew (Redial)
// has its idle connections closed first, until it succeeds, so that its
// attempt dials: the failed answer's connection is closed once its body
// is done with.
func (c *call) takeLane(l *leg) http.RoundTripper {
	s := c.s
	if l.took = l.dispatch; l.took.IsZero() { // a timed leg's dispatch is now
		l.took = timing.Since(c.start)
	}
	if s.lanes.StartRefresh(l.took) {
		go c.t.resolve(s, hostport(l.req))
	}
	l.lane = s.lanes.Take(l.took, atomic.LoadUint64(&c.used))
	if l.lane.Redial.Load() {
		l.lane.Pool.CloseIdleConnections()
	}
	atomic.OrUint64(&c.used, 1<<l.lane.Index)
	return l.lane.Pool
}

// leaveLane tells leg l's lane how its attempt went: outcome o, resp the
// answer if any, err the attempt's error if any (a refused or timed-out
// dial, or no headers within the attempt's timeout, takes the lane out
// at once). It closes the idle connections of the
// lanes the outcome ejected, and of a lane drained by it.
func (c *call) leaveLane(l *leg, resp *http.Response, err error, o policy.Outcome) lane.Report[*lanePool] {
	var now time.Time
	if l.latency > 0 { // send read the time of the answer, from took
		now = l.took.Add(l.latency)
	} else {
		now = timing.Since(l.took)
	}
	var a lane.Answer
	if v := httpx.PushbackValue(resp); v != "" {
		a.Hold, _ = httpx.ParseRetryAfter(v, now)
	}
	a.Hint, _ = httpx.PushbackHint(resp) // the server's own, shorter word for how long it means
	a.Unreached = resp == nil && httpx.Undialed(err)
	_, a.Mute = err.(*attemptTimeoutError) // no headers within the attempt's timeout
	rep := c.s.lanes.Done(l.lane, now, now.Sub(l.took), o, a)
	l.lane = nil
	obs := c.t.obs
	for _, e := range rep.Ejected {
		e.Lane.Pool.CloseIdleConnections()
		if obs != nil && obs.LaneEjected != nil {
			obs.LaneEjected(c.laneEjection(e))
		}
	}
	if e := rep.Returned; e.Lane != nil && obs != nil && obs.LaneReturned != nil {
		obs.LaneReturned(c.laneEjection(e))
	}
	if rep.Drained != nil {
		rep.Drained.Pool.CloseIdleConnections()
	}
	return rep
}

func (c *call) laneEjection(e lane.Ejection[*lanePool]) policy.LaneEjection {
	return policy.LaneEjection{Context: c.ctx, Key: c.s.key, Addr: e.Lane.Addr, Index: e.Lane.Index, Reason: e.Reason, For: e.For}
}

// laneName names the lane leg l was last sent on, for AttemptInfo.Lane:
// its address, or its index when it has none; "" when it took none.
func (l *leg) laneName() string {
	if l.sent == nil {
		return ""
	}
	return policy.LaneName(l.sent.Addr, l.sent.Index)
}

// resolve asks key s's Endpoints for the addresses of hostport, and makes
// the answer its lanes; it runs on a goroutine of its own, started by the
// call that found a refresh due.
func (t *Transport) resolve(s *scope, hostport string) {
	r := s.chain.replicas
	ctx, cancel := context.WithTimeout(context.Background(), r.Refresh)
	addrs, err := r.Endpoints.Resolve(ctx, hostport)
	cancel()
	var added, removed []string
	if was := s.laneAddrs; err == nil {
		if now := laneAddrs(addrs); len(now) > 0 { // an answer Update takes
			added, removed = missing(now, was), missing(was, now)
			s.laneAddrs = now // before Update, whose lock orders it before the next refresh
		}
	}
	for _, l := range s.lanes.Update(time.Now(), addrs, err) {
		l.Pool.CloseIdleConnections()
	}
	if obs := t.obs; obs != nil && obs.LanesChanged != nil && len(added)+len(removed) > 0 {
		obs.LanesChanged(policy.LaneSetChange{
			Context: context.Background(), Key: s.key, Added: added, Removed: removed, Lanes: len(s.laneAddrs),
		})
	}
}

// laneAddrs returns the addresses of an answer of Endpoints that get a
// lane, as lane.Set.Update takes them: empty ones and duplicates dropped,
// the first policy.MaxLanes kept.
func laneAddrs(answer []string) []string {
	var addrs []string
	for _, a := range answer {
		if a != "" && !slices.Contains(addrs, a) && len(addrs) < policy.MaxLanes {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// missing returns the addresses of a that b has not, in a's order.
func missing(a, b []string) []string {
	var m []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			m = append(m, x)
		}
	}
	return m
}

// closeLanes closes the idle connections of every lane of s.
func (s *scope) closeLanes() {
	if s.lanes != nil {
		s.lanes.Pools((*lanePool).closeIdle)
	}
}

// forgetLanes lets the connections of every lane of s go, s being
// forgotten: each closes once its last stream ends.
func (s *scope) forgetLanes() {
	if s.lanes != nil {
		s.lanes.Pools((*lanePool).forget)
	}
}

// hostport returns the host and port req goes to, the scheme's default
// port filled in: what a Resolver is asked.
func hostport(req *http.Request) string {
	port := req.URL.Port()
	if port == "" {
		if port = defaultPort(req.URL.Scheme); port == "" {
			port = "80"
		}
	}
	return net.JoinHostPort(req.URL.Hostname(), port)
}

// Static returns a policy.Resolver whose answer is always addrs (host:port
// each), for the replicas of one host, and so meant for a key's own set in
// Config.PerKey: under Policies, every key would be sent to the same
// addresses.
func Static(addrs ...string) policy.Resolver { return static(slices.Clone(addrs)) }

type static []string

func (s static) Resolve(context.Context, string) ([]string, error) { return slices.Clone(s), nil }

// DNS returns a policy.Resolver that looks the host up with
// net.DefaultResolver, every address it has a lane of its own, on the
// port as given: DNSWith(net.DefaultResolver).
func DNS() policy.Resolver { return dnsResolver{net.DefaultResolver} }

// DNSWith returns a policy.Resolver that looks the host up with r, every
// address it has a lane of its own, on the port as given. For a DNS
// server of the user's own (a cluster's, which the system resolver does
// not ask), r is a net.Resolver with PreferGo and a Dial to that server
// (see docs/replicas.md). r must not be nil.
func DNSWith(r *net.Resolver) policy.Resolver { return dnsResolver{r} }

type dnsResolver struct{ r *net.Resolver }

func (d dnsResolver) Resolve(ctx context.Context, hostport string) ([]string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	ips, err := d.r.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	addrs := make([]string, len(ips))
	for i, ip := range ips {
		addrs[i] = net.JoinHostPort(ip, port)
	}
	return addrs, nil
}
