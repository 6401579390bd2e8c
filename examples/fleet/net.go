package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"

	"github.com/resilix/resilix/httptestutil"
)

// A network serves the fleet's tiers and gives their clients connection
// pools. The demo runs over loopback; its test runs in memory, inside a
// testing/synctest bubble, where time is exact.
type network interface {
	// serve starts h under name and returns its base URL.
	serve(name string, h http.Handler) string
	// pool returns a new connection pool that reaches every served tier.
	pool() http.RoundTripper
	// close shuts down what serve started and the pools' idle connections.
	close()
}

// loopback serves each tier on its own local socket.
type loopback struct {
	mu    sync.Mutex
	srvs  []*httptest.Server
	pools []*http.Transport
}

func (n *loopback) serve(_ string, h http.Handler) string {
	srv := httptest.NewServer(h)
	n.mu.Lock()
	n.srvs = append(n.srvs, srv)
	n.mu.Unlock()
	return srv.URL
}

func (n *loopback) pool() http.RoundTripper {
	// Bounded, as a service's pool should be: 2500 calls a second would
	// otherwise open a connection for each call waiting on a slow tier.
	p := &http.Transport{MaxConnsPerHost: 256, MaxIdleConnsPerHost: 256}
	n.mu.Lock()
	n.pools = append(n.pools, p)
	n.mu.Unlock()
	return p
}

func (n *loopback) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pools {
		p.CloseIdleConnections()
	}
	for _, s := range n.srvs {
		s.Close()
	}
}

// inMemory calls each tier's handler in-process, by the URL's host.
type inMemory struct {
	mu     sync.Mutex
	tiers  map[string]http.RoundTripper
	served int
}

func (n *inMemory) serve(name string, h http.Handler) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.tiers == nil {
		n.tiers = make(map[string]http.RoundTripper)
	}
	n.served++
	host := name + strconv.Itoa(n.served) + ".test"
	n.tiers[host] = httptestutil.InMemory(h)
	return "http://" + host
}

func (n *inMemory) pool() http.RoundTripper { return n }

func (n *inMemory) RoundTrip(req *http.Request) (*http.Response, error) {
	n.mu.Lock()
	rt := n.tiers[req.URL.Host]
	n.mu.Unlock()
	return rt.RoundTrip(req)
}

func (n *inMemory) close() {}
