package httptestutil

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// Network is an in-memory network of HTTP servers, for testing a real
// [http.Transport] (its connection pools, HTTP/1.1 keep-alives, dials)
// without sockets, inside [testing/synctest] bubbles too: connections are
// [net.Pipe]s, which block on channels.
//
// Listen serves an address with one or more replicas, each an
// [http.Handler] behind an [http.Server] of its own; with several, each
// new connection is placed on the next replica in turn, as an L4 balancer
// (a Kubernetes Service) places each TCP connection on one replica.
// [Network.DialContext] connects to an address; [Network.Transport]
// returns an *http.Transport that dials through it.
//
// The zero Network is empty and ready to use; it is safe for concurrent
// use. Close shuts every server down; call it, and the transports'
// CloseIdleConnections, before a bubble ends, so that no goroutine
// remains.
type Network struct {
	mu        sync.Mutex
	listeners map[string]*listener
	dials     int
	open      int
}

type listener struct {
	addr    string
	servers []*http.Server
	next    int
	conns   []chan net.Conn // one per replica
	done    chan struct{}
	wg      sync.WaitGroup
}

// Listen serves addr with replicas, placing each new connection on the
// next one in turn. It panics if addr is already served or no replica is
// given: a test's mistake.
func (n *Network) Listen(addr string, replicas ...http.Handler) {
	if len(replicas) == 0 {
		panic("httptestutil: Network.Listen with no replica")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listeners == nil {
		n.listeners = make(map[string]*listener)
	}
	if _, dup := n.listeners[addr]; dup {
		panic("httptestutil: Network.Listen: " + addr + " already served")
	}
	l := &listener{addr: addr, done: make(chan struct{})}
	for _, h := range replicas {
		srv := &http.Server{Handler: h}
		c := make(chan net.Conn)
		l.servers = append(l.servers, srv)
		l.conns = append(l.conns, c)
		l.wg.Go(func() { _ = srv.Serve(&replicaListener{l: l, c: c}) })
	}
	n.listeners[addr] = l
}

// DialContext connects to addr, as a net.Dialer's DialContext does; the
// network is ignored. An address nobody serves is refused with an error
// matching syscall.ECONNREFUSED.
func (n *Network) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	var c chan net.Conn
	if l != nil {
		c = l.conns[l.next%len(l.conns)]
		l.next++
	}
	n.dials++
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	client, server := net.Pipe()
	pc := &pairCount{n: n}
	select {
	case c <- &countedConn{Conn: server, pc: pc}:
		n.mu.Lock()
		n.open++
		n.mu.Unlock()
		return &countedConn{Conn: client, pc: pc}, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
}

// Transport returns an *http.Transport that dials through n.
func (n *Network) Transport() *http.Transport {
	return &http.Transport{DialContext: n.DialContext, MaxIdleConnsPerHost: 100}
}

// Conns returns how many connections were dialed, and how many of them
// are open now (neither side closed).
func (n *Network) Conns() (dialed, open int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dials, n.open
}

// Close shuts every server down, closing their connections, and waits for
// them to stop.
func (n *Network) Close() {
	n.mu.Lock()
	ls := n.listeners
	n.listeners = nil
	n.mu.Unlock()
	for _, l := range ls {
		close(l.done)
		for _, s := range l.servers {
			s.Close()
		}
		l.wg.Wait()
	}
}

// replicaListener is one replica's net.Listener: it accepts the
// connections the network places on it.
type replicaListener struct {
	l *listener
	c chan net.Conn
}

func (r *replicaListener) Accept() (net.Conn, error) {
	select {
	case c := <-r.c:
		return c, nil
	case <-r.l.done:
		return nil, net.ErrClosed
	}
}

func (r *replicaListener) Close() error   { return nil } // the network closes
func (r *replicaListener) Addr() net.Addr { return pipeAddr(r.l.addr) }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// countedConn is one side of a connection, counted open until either
// side closes it.
type countedConn struct {
	net.Conn
	pc *pairCount
}

type pairCount struct {
	n    *Network
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.pc.once.Do(func() {
		c.pc.n.mu.Lock()
		c.pc.n.open--
		c.pc.n.mu.Unlock()
	})
	return err
}
