package transport_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// A host that is four replicas, one of which fails every call: each
// replica is a lane, a retry goes to a lane its call has not used, and the
// key's breaker, which judges the host, stays closed. The replicas here
// are in memory; in production Base is left nil (or is the caller's
// *http.Transport) and the addresses are the replicas', from
// transport.DNS(), transport.DNSWith or a Resolver of the caller's.
func ExampleStatic() {
	var network httptestutil.Network
	for _, name := range []string{"a", "b", "c", "d"} {
		network.Listen(name+":80", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if name == "d" {
				w.WriteHeader(http.StatusInternalServerError)
			}
			fmt.Fprint(w, name)
		}))
	}
	// Nobody serves api.internal itself: until Static has answered (the
	// answer comes in the background), the first calls fail to dial the
	// host's own address and dial Static's addresses instead.
	defer network.Close()

	rt, err := transport.New(transport.Config{
		Base: network.Transport(),
		PerKey: map[string]policy.Set{"api.internal": {
			Retry:    &policy.Retry{},
			Breaker:  &policy.Breaker{},
			Replicas: &policy.Replicas{Endpoints: transport.Static("a:80", "b:80", "c:80", "d:80")},
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.CloseIdleConnections()
	client := &http.Client{Transport: rt}
	ok := 0
	for range 200 {
		resp, err := client.Get("http://api.internal/")
		if err != nil {
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			ok++
		}
	}
	m := rt.Measured("api.internal")
	fmt.Printf("%d of 200 ok over %d lanes; breaker %v\n", ok, m.Lanes, m.BreakerState)
	// Output: 200 of 200 ok over 4 lanes; breaker closed
}

// Endpoints that asks a DNS server of the caller's (a cluster's), not the
// system's: every address of the name is a lane, on the URL's port.
func ExampleDNSWith() {
	var d net.Dialer
	clusterDNS := &net.Resolver{
		PreferGo: true, // Dial is only used by Go's own resolver
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, "10.96.0.10:53")
		},
	}
	rt, err := transport.New(transport.Config{PerKey: map[string]policy.Set{
		"orders.prod.svc.cluster.local:8080": {
			Replicas: &policy.Replicas{Endpoints: transport.DNSWith(clusterDNS)},
			Retry:    &policy.Retry{},
		},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.CloseIdleConnections()
	_ = &http.Client{Transport: rt}
}
