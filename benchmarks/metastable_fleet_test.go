package benchmarks

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// resilixSets are the resilix configurations the simulated fleet can be
// run with, by name (TestMetastableFleet): the quick start, the quick
// start without Throttler or without Hedge, and each policy alone.
var resilixSets = []struct {
	name string
	set  func() policy.Set
}{
	{"resilix", quickStart},
	{"resilix-without-throttler", func() policy.Set {
		s := quickStart()
		s.Throttler = nil
		return s
	}},
	{"resilix-without-hedge", func() policy.Set {
		s := quickStart()
		s.Hedge = nil
		return s
	}},
	{"retry", func() policy.Set { return policy.Set{Attempts: 3, Retry: &policy.Retry{}} }},
	{"hedge", func() policy.Set { return policy.Set{Hedge: &policy.Hedge{}} }},
	{"breaker", func() policy.Set { return policy.Set{Breaker: &policy.Breaker{}} }},
	{"limiter", func() policy.Set { return policy.Set{Limiter: &policy.Limiter{}} }},
	{"throttler", func() policy.Set { return policy.Set{Throttler: &policy.Throttler{}} }},
	{"timeout", func() policy.Set { return policy.Set{Timeout: &policy.Timeout{PerAttempt: 2 * time.Second}} }},
}

// fleetClient is the client named name: one of metaClients, or a resilix
// set of resilixSets.
func fleetClient(name string) (metaClient, bool) {
	for _, m := range metaClients {
		if m.name == name {
			return m, true
		}
	}
	// "set@opts": the set with its Throttler's fields set (throttlerOpts).
	base, opts, _ := strings.Cut(name, "@")
	for _, rs := range resilixSets {
		if rs.name == base {
			set := rs.set
			if opts != "" {
				tune, err := throttlerOpts(opts)
				if err != nil {
					return metaClient{}, false
				}
				set = func() policy.Set {
					s := rs.set()
					if s.Throttler != nil {
						tune(s.Throttler)
					}
					return s
				}
			}
			return metaClient{name, func(tb testing.TB, base http.RoundTripper, url string) caller {
				c := &http.Client{Transport: mustResilix(tb, base, set())}
				return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
			}}, true
		}
	}
	return metaClient{}, false
}

// throttlerOpts parses the options of a fleet client's name after its "@":
// fields of its set's Throttler, separated by "/", each "window=2s",
// "k=1.25", "min=10" (MinRequests) or "max=0.8" (MaxRejection); a bare
// duration is the window ("resilix@2s").
func throttlerOpts(opts string) (func(*policy.Throttler), error) {
	var set []func(*policy.Throttler)
	for _, o := range strings.Split(opts, "/") {
		key, val, ok := strings.Cut(o, "=")
		if !ok {
			key, val = "window", o
		}
		var err error
		switch key {
		case "window":
			var w time.Duration
			w, err = time.ParseDuration(val)
			set = append(set, func(t *policy.Throttler) { t.Window = w })
		case "k", "max":
			var f float64
			f, err = strconv.ParseFloat(val, 64)
			if key == "k" {
				set = append(set, func(t *policy.Throttler) { t.K = f })
			} else {
				set = append(set, func(t *policy.Throttler) { t.MaxRejection = f })
			}
		case "min":
			var n int
			n, err = strconv.Atoi(val)
			set = append(set, func(t *policy.Throttler) { t.MinRequests = n })
		default:
			err = fmt.Errorf("no throttler option %q", key)
		}
		if err != nil {
			return nil, err
		}
	}
	return func(t *policy.Throttler) {
		for _, f := range set {
			f(t)
		}
	}, nil
}

// TestMetastableFleet runs only the simulated fleet of make metastable, in
// virtual time, for the clients named in RESILIX_FLEET (comma-separated:
// the names of make metastable's clients, or of the resilix sets above;
// "all" for every one), against plain FIFO servers, or, with
// RESILIX_FLEET_SERVER=admission, against the same servers behind
// admission.Handler at its defaults ("both" runs each). RESILIX_FLEET_CLIENTS
// sets the fleet's size (200 if unset). It prints the table and each run
// second by second; the figures are the same in every run, whatever else
// the machine does.
//
//	RESILIX_FLEET=resilix,resilix-without-throttler go test -count=1 -run '^TestMetastableFleet$' -v -timeout 30m .
func TestMetastableFleet(t *testing.T) {
	names := os.Getenv("RESILIX_FLEET")
	if names == "" {
		t.Skip("RESILIX_FLEET=client,... runs it")
	}
	var clients []metaClient
	if names == "all" {
		clients = slices.Clone(metaClients)
		for _, rs := range resilixSets[1:] {
			m, _ := fleetClient(rs.name)
			clients = append(clients, m)
		}
	} else {
		for _, n := range strings.Split(names, ",") {
			m, ok := fleetClient(strings.TrimSpace(n))
			if !ok {
				t.Fatalf("RESILIX_FLEET: no client %q", n)
			}
			clients = append(clients, m)
		}
	}
	f := fleet{clients: 200, servers: 4}
	if v := os.Getenv("RESILIX_FLEET_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("RESILIX_FLEET_CLIENTS: %q is not a positive number", v)
		}
		f.clients = n
	}
	var admit []bool
	switch os.Getenv("RESILIX_FLEET_SERVER") {
	case "", "fifo":
		admit = []bool{false}
	case "admission":
		admit = []bool{true}
	case "both":
		admit = []bool{false, true}
	default:
		t.Fatalf("RESILIX_FLEET_SERVER: want fifo, admission or both")
	}
	sc := metastableRun
	for _, a := range admit {
		f.admission = a
		var outs []outcome
		for _, m := range clients {
			start := time.Now()
			o := runSimulated(t, sc, f, m)
			t.Logf("%s(%v)", perSecond(o), time.Since(start).Round(time.Second))
			outs = append(outs, o)
		}
		server := "plain FIFO servers"
		if a {
			server = "FIFO servers behind admission.Handler"
		}
		fmt.Printf("\nSimulated fleet: %d clients of each kind, %d %s behind one address, %d calls/s offered:\n\n%s\n",
			f.clients, f.servers, server, sc.rate*f.servers, table(outs))
	}
}
