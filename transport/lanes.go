package transport

import (
	"context"
	"net"
	"net/http"
	"slices"

	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/policy"
)

// lanes is a key's lanes, each with a pool of its own (see lanePool).
type lanes = lane.Set[*lanePool]

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
