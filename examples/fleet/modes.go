package main

import (
	"net/http"
	"net/netip"
	"sync/atomic"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

// A fleetMode builds the two services around the back tier's work, and
// the load generator's client.
type fleetMode interface {
	name() string
	build(n network, b *back, backURL string) (*fleet, error)
}

// fleet is one mode's tiers, built.
type fleet struct {
	backHandler  http.Handler
	frontHandler http.Handler
	client       *http.Client // the load generator's
	tries        int          // the load generator's, per logical call
	pushedBack   atomic.Int64 // attempts a client held back on a server's pushback
	throttled    atomic.Int64 // attempts a client's throttler refused on its own estimate
}

// measure runs the overload and the outage, each on a fleet of its own.
func measure(n network, m fleetMode, sz size) (result, error) {
	r := result{mode: m.name()}

	f, b, front, back, err := start(n, m)
	if err != nil {
		return r, err
	}
	// The fleet runs calm before the flood, as a service does before a
	// spike: its Critical traffic alone, not counted.
	(&load{
		client: f.client, url: front.url, classes: []*class{{prio: shedding.Critical, rate: criticalRate}},
		dur: warmup, deadline: deadline, tries: f.tries,
	}).run()
	b.started.Store(0)
	b.wasted.Store(0)
	front.calls.Store(0)
	back.calls.Store(0)
	f.pushedBack.Store(0)
	f.throttled.Store(0)
	r.critical = &class{prio: shedding.Critical, rate: criticalRate}
	r.bulk = &class{prio: shedding.Bulk, rate: bulkRate}
	(&load{
		client: f.client, url: front.url, classes: []*class{r.critical, r.bulk},
		dur: sz.overload, deadline: deadline, tight: tightShare, tightDeadline: tightDeadline,
		tries: f.tries, settle: settle,
	}).run()
	r.started, r.wasted = b.started.Load(), b.wasted.Load()
	r.frontCalls, r.backCalls = front.calls.Load(), back.calls.Load()
	r.pushedBack, r.throttled = f.pushedBack.Load(), f.throttled.Load()

	f, b, front, back, err = start(n, m)
	if err != nil {
		return r, err
	}
	b.down.Store(true)
	crit, bulk := &class{prio: shedding.Critical, rate: outageRate}, &class{prio: shedding.Bulk, rate: outageRate}
	(&load{
		client: f.client, url: front.url, classes: []*class{crit, bulk},
		dur: sz.outage, deadline: deadline, tight: 0, tightDeadline: deadline,
		tries: f.tries,
	}).run()
	r.outageOffered = crit.calls.Load() + bulk.calls.Load()
	r.outageBack = back.calls.Load()
	return r, nil
}

// tier is a served, counted handler.
type tier struct {
	*counted
	url string
}

func start(n network, m fleetMode) (*fleet, *back, tier, tier, error) {
	b := newBack(backWorkers, backWork)
	back, front := tier{counted: &counted{}}, tier{counted: &counted{}}
	back.url = n.serve("back", back.counted)
	front.url = n.serve("front", front.counted)
	f, err := m.build(n, b, back.url)
	if err != nil {
		return nil, nil, tier{}, tier{}, err
	}
	// No call is made before the load starts, after this.
	back.h, front.h = f.backHandler, f.frontHandler
	return f, b, front, back, nil
}

// plainMode is net/http as most services use it: no admission, each
// client a connection pool, and a naive retry loop at each tier.
type plainMode struct{}

func (plainMode) name() string { return "plain net/http" }

func (plainMode) build(n network, b *back, backURL string) (*fleet, error) {
	const tries = 3
	return &fleet{
		backHandler:  b,
		frontHandler: &front{client: &http.Client{Transport: n.pool()}, back: backURL, tries: tries},
		client:       &http.Client{Transport: n.pool()},
		tries:        tries,
	}, nil
}

// resilixMode puts package admission in front of each service and a
// resilix transport, with Propagate on, under each client.
type resilixMode struct{}

func (resilixMode) name() string { return "resilix" }

// internal trusts the priority of callers inside the fleet: loopback, and
// the documentation address the in-memory network gives its callers.
func internal(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	return a.IsLoopback() || netip.MustParsePrefix("192.0.2.0/24").Contains(a)
}

func (resilixMode) build(n network, b *back, backURL string) (*fleet, error) {
	f := &fleet{tries: 1}
	// What the clients refuse before the wire: held back by the servers'
	// pushback (a positive RetryAfter), or by the throttler's own
	// estimate.
	obs := &policy.Observer{
		Refused: func(e policy.Refusal) {
			switch {
			case e.Gate != policy.GateThrottler:
			case e.Err.RetryAfter > 0:
				f.pushedBack.Add(1)
			default:
				f.throttled.Add(1)
			}
		},
	}
	client := func() (*http.Client, error) {
		rt, err := transport.New(transport.Config{
			Base:     n.pool(),
			Observer: obs,
			Policies: policy.Set{
				Propagate: true,
				Retry:     &policy.Retry{},
				Throttler: &policy.Throttler{}, // at its defaults, as in README.md's quick start
			},
		})
		if err != nil {
			return nil, err
		}
		return &http.Client{Transport: rt}, nil
	}
	var err error
	if f.client, err = client(); err != nil {
		return nil, err
	}
	frontClient, err := client()
	if err != nil {
		return nil, err
	}
	// Each service admits through an adaptive limit, sheds Bulk first,
	// and starts no call that has less time left than its work takes.
	cfg := admission.Config{Trust: internal, MinTimeout: backWork}
	cfg.Name = "back"
	if f.backHandler, err = admission.Handler(b, cfg); err != nil {
		return nil, err
	}
	cfg.Name = "front"
	cfg.Limiter.MaxLimit = 0
	f.frontHandler, err = admission.Handler(&front{client: frontClient, back: backURL, tries: 1}, cfg)
	return f, err
}
