package transport

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/resilix/resilix/policy"
)

// lanePool is a lane's connection pool: a clone of the base (see
// newPoolTransport), made anew each time the lane lets its connections go,
// so that a lane drained, ejected, dialed anew or whose key was forgotten
// never sends again on a connection it let go, and each connection it let
// go is closed at once if idle, or once its last stream ends.
//
// Why count streams, and not connections through the dialer: net/http's
// HTTP/1 pool closes a connection that falls idle after
// CloseIdleConnections (as long as nothing asks the pool for one since),
// its HTTP/2 pool does not, and neither says when a connection falls idle;
// a dialer sees a connection open, never a stream end (and wrapping the
// connections it returns would hide a *tls.Conn from net/http, which needs
// it to speak HTTP/2 over a DialTLSContext's). What ends a stream is seen
// here: an attempt ends at its headers over HTTP/1 (its connection goes
// back to the pool, or is closed, when its body is done with), and over
// HTTP/2 when its body is read to the end or closed. A clone let go has
// its idle connections closed (CloseIdleConnections) at once, and again
// each time one of its streams ends, which closes a connection whose last
// stream that was; its last stream's end closes every connection it has
// left, each being idle then.
//
// The RoundTrip of a lane's pool allocates one small wrapper for an
// HTTP/2 answer's body, to see its stream end; an HTTP/1 answer's body is
// not wrapped. A lanePool is safe for concurrent use.
type lanePool struct {
	base    *http.Transport
	addr    string
	resolve policy.Resolver // the first lane's Endpoints, which it dials through; nil otherwise
	let     *letGo          // the transport's pools let go that still have streams

	cur  atomic.Pointer[poolGen] // nil once let go, until the next attempt
	mu   sync.Mutex              // making a clone
	done bool                    // its key was forgotten: every clone made now is let go at once; guarded by mu
}

// poolGen is one clone of a lane's pool, and its streams.
type poolGen struct {
	t       *http.Transport
	streams atomic.Int64 // attempts in flight, and HTTP/2 bodies not done with
	used    atomic.Bool  // it sent an attempt, so it may have connections
	gone    atomic.Bool  // let go: closed when its streams end
}

// newLanePool returns a lane's pool over base, dialing addr (see
// newPoolTransport), or, for the lane that dials the request's own
// address while a key's Endpoints has not answered, resolving through
// resolve when it is not nil.
func newLanePool(base *http.Transport, addr string, resolve policy.Resolver, let *letGo) *lanePool {
	p := &lanePool{base: base, addr: addr, resolve: resolve, let: let}
	p.cur.Store(&poolGen{t: newPoolTransport(base, addr, resolve)})
	return p
}

// RoundTrip sends req on the pool's current clone, making one if the last
// was let go. A panic of the clone (a Proxy func's, say) ends the stream
// it began, and goes on.
func (p *lanePool) RoundTrip(req *http.Request) (*http.Response, error) {
	g := p.cur.Load()
	if g == nil {
		g = p.renew()
	}
	g.streams.Add(1)
	if !g.used.Load() {
		g.used.Store(true)
	}
	returned := false
	defer func() {
		if !returned {
			g.end(p.let)
		}
	}()
	resp, err := g.t.RoundTrip(req)
	returned = true
	if err != nil || resp.ProtoMajor != 2 || resp.Body == nil || resp.Body == http.NoBody {
		g.end(p.let)
		return resp, err
	}
	resp.Body = &streamBody{rc: resp.Body, g: g, let: p.let}
	return resp, nil
}

// renew returns the pool's current clone, making one if there is none: a
// clone of a forgotten key's pool is let go at once, and closed when the
// attempt that made it ends.
func (p *lanePool) renew() *poolGen {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := p.cur.Load(); g != nil {
		return g
	}
	g := &poolGen{t: newPoolTransport(p.base, p.addr, p.resolve)}
	if p.done {
		g.gone.Store(true)
		p.let.add(g)
		return g
	}
	p.cur.Store(g)
	return g
}

// CloseIdleConnections lets the pool's connections go: the clone in use
// has its idle connections closed at once, and each other once its last
// stream ends (see letGo), and the pool's next attempt goes out on a new
// clone, which dials. A clone that never sent an attempt has no
// connection to let go, and is kept.
func (p *lanePool) CloseIdleConnections() {
	p.mu.Lock()
	g := p.cur.Load()
	if g == nil || !g.used.Load() {
		p.mu.Unlock()
		return
	}
	p.cur.Store(nil)
	p.mu.Unlock()
	g.letGo(p.let)
}

// forget lets the pool's connections go for good: its key was forgotten,
// and a late attempt of one of its calls gets a clone let go at once.
func (p *lanePool) forget() {
	p.mu.Lock()
	p.done = true
	g := p.cur.Swap(nil)
	p.mu.Unlock()
	if g != nil {
		g.letGo(p.let)
	}
}

// closeIdle closes the idle connections of the pool's current clone.
func (p *lanePool) closeIdle() {
	if g := p.cur.Load(); g != nil {
		g.t.CloseIdleConnections()
	}
}

// letGo marks g let go and closes its idle connections at once: over
// HTTP/1, a busy one is then closed as it falls idle; over HTTP/2, by the
// end of its last stream (see end). g is closed if no stream is open on
// it.
func (g *poolGen) letGo(let *letGo) {
	let.add(g)
	g.gone.Store(true)
	g.t.CloseIdleConnections()
	if g.streams.Load() == 0 {
		g.close(let)
	}
}

// end ends one of g's streams. If g was let go, it closes g's idle
// connections, among them, over HTTP/2, the stream's own if this was the
// last stream on it, and closes g if this was its last stream.
func (g *poolGen) end(let *letGo) {
	n := g.streams.Add(-1)
	switch {
	case !g.gone.Load():
	case n == 0:
		g.close(let)
	default:
		g.t.CloseIdleConnections()
	}
}

// close closes every connection of g, a clone let go with no stream open:
// each is idle. A late attempt that loaded g before it was let go ends by
// closing it again.
func (g *poolGen) close(let *letGo) {
	let.remove(g)
	g.t.CloseIdleConnections()
}

// streamBody is an HTTP/2 answer's body on a lane, which ends its stream
// on the clone it came from once, at EOF, at a read error or at Close.
// At EOF or a read error it closes the body first: net/http's Close
// returns once the stream is forgotten by its connection, so that the
// connection is idle when the clone is closed.
type streamBody struct {
	rc   io.ReadCloser
	g    *poolGen
	let  *letGo
	done atomic.Bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && b.done.CompareAndSwap(false, true) {
		b.rc.Close()
		b.g.end(b.let)
	}
	return n, err
}

func (b *streamBody) Close() error {
	err := b.rc.Close()
	if b.done.CompareAndSwap(false, true) {
		b.g.end(b.let)
	}
	return err
}

// letGo is a transport's clones of lanes' pools that were let go while
// streams were open on them, which Transport.CloseIdleConnections still
// reaches until their last stream ends and closes them.
type letGo struct {
	mu sync.Mutex
	m  map[*poolGen]struct{}
}

func (l *letGo) add(g *poolGen) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[*poolGen]struct{})
	}
	l.m[g] = struct{}{}
}

func (l *letGo) remove(g *poolGen) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, g)
}

// closeIdle closes the idle connections of every clone let go that still
// has streams open.
func (l *letGo) closeIdle() {
	l.mu.Lock()
	gs := make([]*poolGen, 0, len(l.m))
	for g := range l.m {
		gs = append(gs, g)
	}
	l.mu.Unlock()
	for _, g := range gs {
		g.t.CloseIdleConnections()
	}
}

// newPoolTransport returns a clone of base for a lane's pool, which, for
// an address lane, dials addr in place of the request's address. The
// request's Host header and TLS server name are unchanged, so the replica
// is asked for, and must prove it is, the request's host. The base's
// Proxy is not used for an address lane: a proxy would choose the replica
// itself. With resolve (the lane of a key with Endpoints that serves its
// calls until Endpoints first answers), the clone dials the request's own
// address, and, when that fails, the addresses resolve gives for it (see
// redirect), so that a name only Endpoints knows (a cluster's DNS server)
// is reached from the first call; it uses no proxy either.
func newPoolTransport(base *http.Transport, addr string, resolve policy.Resolver) *http.Transport {
	p := base.Clone()
	if addr == "" && resolve == nil {
		return p
	}
	// A user's base may still set the deprecated Dial and DialTLS; they
	// are honoured as net/http honours them, DialContext first.
	dial := base.DialContext
	//lint:ignore SA1019 honoured when the base sets it
	if d := base.Dial; dial == nil && d != nil {
		dial = func(_ context.Context, network, addr string) (net.Conn, error) { return d(network, addr) }
	}
	if dial == nil {
		dial = new(net.Dialer).DialContext
	}
	p.Proxy = nil
	p.DialContext = redirect(dial, addr, resolve)
	//lint:ignore SA1019 honoured when the base sets it
	tls := base.DialTLS
	if tlsc := base.DialTLSContext; tlsc != nil {
		p.DialTLSContext = redirect(tlsc, addr, resolve)
	} else if tls != nil {
		d := redirect(func(_ context.Context, network, addr string) (net.Conn, error) { return tls(network, addr) }, addr, resolve)
		//lint:ignore SA1019 honoured when the base sets it
		p.DialTLS = func(network, a string) (net.Conn, error) { return d(context.Background(), network, a) }
	}
	return p
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// redirect returns dial sent to addr in place of the address asked; or,
// with resolve, dial to the address asked, and, if that fails while the
// dial's context is live, to the addresses resolve gives for it, in
// order, the first that answers. The own dial's error is returned when
// none does.
func redirect(dial dialFunc, addr string, resolve policy.Resolver) dialFunc {
	if resolve == nil {
		return func(ctx context.Context, network, _ string) (net.Conn, error) { return dial(ctx, network, addr) }
	}
	return func(ctx context.Context, network, asked string) (net.Conn, error) {
		c, err := dial(ctx, network, asked)
		if err == nil || ctx.Err() != nil {
			return c, err
		}
		addrs, rerr := resolve.Resolve(ctx, asked)
		if rerr != nil {
			return nil, err
		}
		for _, a := range addrs {
			if a == asked || a == "" {
				continue
			}
			if c, aerr := dial(ctx, network, a); aerr == nil {
				return c, nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		return nil, err
	}
}
