package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// connReplica is an HTTP/2 server over TLS on a loopback address of its
// own (127.0.0.n), which counts its connections as they open and close.
// GET /stream sends its headers once its batch has arrived (see
// streamBatch) and its body when released; any other path answers status
// (200 if zero).
type connReplica struct {
	srv      *httptest.Server
	batch    *streamBatch
	open     atomic.Int64 // connections open now
	accepted atomic.Int64 // connections ever accepted
	hits     atomic.Int64 // requests other than /stream
	status   atomic.Int64

	mu      sync.Mutex
	streams int           // /stream bodies not yet sent
	release chan struct{} // closed to send them
}

func newConnReplica(t *testing.T, batch *streamBatch, n int) *connReplica {
	t.Helper()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", n))
	if err != nil {
		t.Skipf("no loopback address 127.0.0.%d: %v", n, err)
	}
	r := &connReplica{batch: batch, release: make(chan struct{})}
	r.srv = httptest.NewUnstartedServer(r)
	r.srv.Listener.Close()
	r.srv.Listener = l
	r.srv.EnableHTTP2 = true
	r.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			r.open.Add(1)
			r.accepted.Add(1)
		case http.StateClosed, http.StateHijacked:
			r.open.Add(-1)
		}
	}
	r.srv.StartTLS()
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.finish) // first: Close waits for the handlers
	return r
}

func (r *connReplica) addr() string { return r.srv.Listener.Addr().String() }

func (r *connReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/slow" { // its body 40 ms after its headers
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-time.After(40 * time.Millisecond):
			io.WriteString(w, "streamed")
		case <-req.Context().Done():
		}
		return
	}
	if req.URL.Path != "/stream" {
		r.hits.Add(1)
		if s := int(r.status.Load()); s != 0 {
			w.WriteHeader(s)
		}
		io.WriteString(w, "ok")
		return
	}
	r.mu.Lock()
	r.streams++
	release := r.release
	r.mu.Unlock()
	r.batch.arrive(req.Context())
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	select {
	case <-release:
		io.WriteString(w, "streamed")
	case <-req.Context().Done():
	}
}

// streaming returns how many /stream bodies r holds.
func (r *connReplica) streaming() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streams
}

// finish sends every /stream body r holds.
func (r *connReplica) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.release)
	r.release = make(chan struct{})
	r.streams = 0
}

// waitClosed waits until r has open connections open, or fails the test after
// 3 s (socket closes are polled).
func (r *connReplica) waitClosed(t *testing.T, open int64, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for r.open.Load() != open {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d connections open after its last stream ended, want %d", what, r.open.Load(), open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// answers is an Endpoints whose answer a test sets, and which counts its
// questions.
type answers struct {
	mu    sync.Mutex
	addrs []string
	asked int
}

func (a *answers) set(addrs ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.addrs, a.asked = addrs, 0
}

func (a *answers) times() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked
}

func (a *answers) Resolve(context.Context, string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked++
	return append([]string(nil), a.addrs...), nil
}

// connsClient returns a base for the replicas' TLS (every httptest server
// has the same certificate, for example.com among others), speaking
// HTTP/major (1 or 2), which refuses to dial example.com itself: only
// lanes reach the replicas.
func connsClient(r *connReplica, major int) *http.Transport {
	base := r.srv.Client().Transport.(*http.Transport).Clone()
	if major == 1 {
		base.ForceAttemptHTTP2 = false
		base.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		base.TLSClientConfig.NextProtos = nil
	}
	var d net.Dialer
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == "example.com:443" {
			return nil, errors.New("example.com is only known to Endpoints")
		}
		return d.DialContext(ctx, network, addr)
	}
	return base
}

// connsGet sends GET https://example.com+path through rt and returns the
// answer unread, or fails the test if it fails or is not over HTTP/major.
func connsGet(t *testing.T, rt http.RoundTripper, path string, major int) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://example.com"+path, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.ProtoMajor != major {
		t.Fatalf("GET %s came back over %s, want HTTP/%d", path, resp.Proto, major)
	}
	return resp
}

func readClose(resp *http.Response) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// streamBatch holds the headers of /stream answers until a batch of them
// has arrived, so that a batch's attempts are in flight together and
// spread over the lanes as load does.
type streamBatch struct {
	mu      sync.Mutex
	want    int
	arrived int
	all     chan struct{}
}

// expect starts a batch of n.
func (b *streamBatch) expect(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.want, b.arrived, b.all = n, 0, make(chan struct{})
}

func (b *streamBatch) arrive(ctx context.Context) {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.want {
		close(b.all)
	}
	all := b.all
	b.mu.Unlock()
	select {
	case <-all:
	case <-ctx.Done():
	}
}

// openStreams opens batches of four /stream bodies through rt until each
// replica holds one, and returns them.
func openStreams(t *testing.T, rt http.RoundTripper, major int, batch *streamBatch, reps ...*connReplica) []*http.Response {
	t.Helper()
	var open []*http.Response
	for range 10 {
		held := 0
		for _, r := range reps {
			if r.streaming() > 0 {
				held++
			}
		}
		if held == len(reps) {
			return open
		}
		batch.expect(4)
		resps := make([]*http.Response, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, "https://example.com/stream", nil)
				resps[i], errs[i] = rt.RoundTrip(req)
			})
		}
		wg.Wait()
		for i, resp := range resps {
			if errs[i] != nil {
				t.Fatalf("GET /stream: %v", errs[i])
			}
			if resp.ProtoMajor != major {
				t.Fatalf("GET /stream came back over %s, want HTTP/%d", resp.Proto, major)
			}
			open = append(open, resp)
		}
	}
	t.Fatal("10 batches of streams did not reach every replica")
	return nil
}

// primeAnswers makes rt's first call, which starts the first refresh of
// its Endpoints a, and calls until a's answer is in use (a second
// question is only asked once the first answer is applied).
func primeAnswers(t *testing.T, rt http.RoundTripper, a *answers) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for a.times() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("Endpoints was not asked twice in 3 s")
		}
		req, _ := http.NewRequest(http.MethodGet, "https://example.com/", nil)
		if resp, err := rt.RoundTrip(req); err == nil {
			readClose(resp)
		}
	}
}

// TestADrainedLanesConnectionClosesAfterItsLastStream: a lane whose
// address left Endpoints' answer while a stream was open on its HTTP/2
// connection has that connection closed once the stream ends.
func TestADrainedLanesConnectionClosesAfterItsLastStream(t *testing.T) {
	for _, major := range []int{2, 1} {
		t.Run(fmt.Sprintf("HTTP_%d", major), func(t *testing.T) {
			batch := new(streamBatch)
			a, b := newConnReplica(t, batch, 2), newConnReplica(t, batch, 3)
			ends := new(answers)
			ends.set(a.addr(), b.addr())
			rt, err := New(Config{Base: connsClient(a, major), Policies: policy.Set{
				Replicas: &policy.Replicas{Endpoints: ends, Refresh: time.Millisecond},
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.CloseIdleConnections()
			primeAnswers(t, rt, ends)
			open := openStreams(t, rt, major, batch, a, b)

			ends.set(b.addr()) // a leaves the set
			primeAnswers(t, rt, ends)
			a.finish()
			b.finish()
			for _, resp := range open {
				readClose(resp)
			}
			a.waitClosed(t, 0, "the drained lane")
			if b.open.Load() == 0 {
				t.Error("the kept lane's connections were closed")
			}
		})
	}
}

// TestAnEjectedLaneReturnsOnANewConnection: a lane ejected while a
// stream was open on its HTTP/2 connection has that connection closed once
// the stream ends, and comes back on a new one.
func TestAnEjectedLaneReturnsOnANewConnection(t *testing.T) {
	for _, major := range []int{2, 1} {
		t.Run(fmt.Sprintf("HTTP_%d", major), func(t *testing.T) {
			batch := new(streamBatch)
			a, b := newConnReplica(t, batch, 2), newConnReplica(t, batch, 3)
			ends := new(answers)
			ends.set(a.addr(), b.addr())
			var mu sync.Mutex
			var ejected []string
			rt, err := New(Config{
				Base: connsClient(a, major),
				Policies: policy.Set{Replicas: &policy.Replicas{
					Endpoints: ends, Refresh: time.Hour, ConsecutiveFailures: 1, EjectFor: 100 * time.Millisecond,
				}},
				Observer: &policy.Observer{LaneEjected: func(e policy.LaneEjection) {
					mu.Lock()
					defer mu.Unlock()
					ejected = append(ejected, e.Addr)
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, "https://example.com/", nil)
			if resp, err := rt.RoundTrip(req); err == nil { // the first call, which asks Endpoints
				readClose(resp)
			}
			deadline := time.Now().Add(3 * time.Second)
			for rt.Measured("example.com").Lanes != 2 {
				if time.Now().After(deadline) {
					t.Fatal("Endpoints' answer not in use after 3 s")
				}
				time.Sleep(time.Millisecond)
			}
			open := openStreams(t, rt, major, batch, a, b)

			a.status.Store(http.StatusInternalServerError)
			b.status.Store(http.StatusInternalServerError)
			readClose(connsGet(t, rt, "/", major))
			a.status.Store(0)
			b.status.Store(0)
			mu.Lock()
			if len(ejected) != 1 {
				mu.Unlock()
				t.Fatalf("lanes ejected: %v, want one", ejected)
			}
			out, kept := a, b
			if ejected[0] == b.addr() {
				out, kept = b, a
			}
			mu.Unlock()
			before := out.accepted.Load()

			a.finish()
			b.finish()
			for _, resp := range open {
				readClose(resp)
			}
			out.waitClosed(t, 0, "the ejected lane")
			if kept.open.Load() == 0 {
				t.Error("the lane not ejected had its connections closed")
			}
			hits := out.hits.Load()
			deadline = time.Now().Add(3 * time.Second)
			for out.hits.Load() == hits {
				if time.Now().After(deadline) {
					t.Fatal("the ejected lane got no call in 3 s")
				}
				readClose(connsGet(t, rt, "/", major))
			}
			if n := out.accepted.Load() - before; n != 1 {
				t.Errorf("the lane came back from its ejection on %d new connections, want 1", n)
			}
		})
	}
}

// TestAnEvictedKeysConnectionsCloseAfterTheirLastStream: a key forgotten
// (MaxKeys) while streams were open on its lanes' HTTP/2 connections has
// those connections closed once the streams end.
func TestAnEvictedKeysConnectionsCloseAfterTheirLastStream(t *testing.T) {
	for _, major := range []int{2, 1} {
		t.Run(fmt.Sprintf("HTTP_%d", major), func(t *testing.T) {
			batch := new(streamBatch)
			a, b, other := newConnReplica(t, batch, 2), newConnReplica(t, batch, 3), newConnReplica(t, batch, 1)
			ends := new(answers)
			ends.set(a.addr(), b.addr())
			rt, err := New(Config{
				Base:     connsClient(a, major),
				MaxKeys:  1,
				Policies: policy.Set{},
				PerKey:   map[string]policy.Set{"example.com": {Replicas: &policy.Replicas{Endpoints: ends, Refresh: time.Millisecond}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.CloseIdleConnections()
			primeAnswers(t, rt, ends)
			open := openStreams(t, rt, major, batch, a, b)

			req, _ := http.NewRequest(http.MethodGet, "https://"+other.addr()+"/", nil)
			resp, err := rt.RoundTrip(req) // evicts example.com, MaxKeys being 1
			if err != nil {
				t.Fatal(err)
			}
			readClose(resp)
			if rt.Measured("example.com").HasReplicas {
				t.Fatal("example.com was not evicted")
			}
			a.finish()
			b.finish()
			for _, resp := range open {
				readClose(resp)
			}
			a.waitClosed(t, 0, "the evicted key's lane on a")
			b.waitClosed(t, 0, "the evicted key's lane on b")
		})
	}
}

// TestALaneWrapsAnHTTP2BodyOnce: over lanes, a call whose answer came
// over HTTP/2 allocates one wrapper of its body more than over the base
// (to see its stream end), and a call over HTTP/1 nothing more. Each
// pool, and the base, answer from a RoundTripper registered for "http".
func TestALaneWrapsAnHTTP2BodyOnce(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	body := strings.NewReader("")
	for _, major := range []int{1, 2} {
		answer := fakeRT(func(*http.Request) (*http.Response, error) {
			body.Reset("")
			return &http.Response{StatusCode: http.StatusOK, ProtoMajor: major, Body: io.NopCloser(body)}, nil
		})
		measure := func(set policy.Set) float64 {
			base := new(http.Transport)
			base.RegisterProtocol("http", answer)
			rt, err := New(Config{Base: base, Policies: set})
			if err != nil {
				t.Fatal(err)
			}
			s := rt.scopes.enter("api", time.Now())
			s.leave()
			if s.lanes != nil {
				s.lanes.Pools(func(p *lanePool) { p.cur.Load().t.RegisterProtocol("http", answer) })
			}
			req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
			return testing.AllocsPerRun(1000, func() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		off := measure(policy.Set{})
		on := measure(policy.Set{Replicas: &policy.Replicas{}})
		want := off
		if major == 2 {
			want++
		}
		if on != want {
			t.Errorf("HTTP/%d: a call allocates %v times over lanes, %v over the base, want %v", major, on, off, want)
		}
	}
}

// TestLaneChurnLeavesNoConnectionOpen: while Endpoints' answer rotates
// over four replicas every 30 ms for a second, under four callers whose
// bodies stream 40 ms each, every connection of a lane let go is closed
// once its last stream ends, and CloseIdleConnections closes the rest:
// none is left open.
func TestLaneChurnLeavesNoConnectionOpen(t *testing.T) {
	batch := new(streamBatch)
	var reps []*connReplica
	var addrs []string
	for n := 2; n <= 5; n++ {
		r := newConnReplica(t, batch, n)
		reps = append(reps, r)
		addrs = append(addrs, r.addr())
	}
	var turn atomic.Int64
	rotating := resolverFunc(func(context.Context, string) ([]string, error) {
		i := int(turn.Add(1))
		return []string{addrs[i%4], addrs[(i+1)%4], addrs[(i+2)%4]}, nil
	})
	rt, err := New(Config{Base: connsClient(reps[0], 2), Policies: policy.Set{
		Replicas: &policy.Replicas{Endpoints: rotating, Refresh: 30 * time.Millisecond},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.CloseIdleConnections()
	deadline := time.Now().Add(3 * time.Second)
	for rt.Measured("example.com").Lanes != 3 { // the first answer is in
		if time.Now().After(deadline) {
			t.Fatal("Endpoints' answer not in use after 3 s")
		}
		req, _ := http.NewRequest(http.MethodGet, "https://example.com/", nil)
		if resp, err := rt.RoundTrip(req); err == nil {
			readClose(resp)
		}
	}
	end := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	var calls, failed atomic.Int64
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(end) {
				calls.Add(1)
				req, _ := http.NewRequest(http.MethodGet, "https://example.com/slow", nil)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				readClose(resp)
			}
		})
	}
	wg.Wait()
	open := func() (n int64) {
		for _, r := range reps {
			n += r.open.Load()
		}
		return n
	}
	accepted := int64(0)
	for _, r := range reps {
		accepted += r.accepted.Load()
	}
	t.Logf("%d calls (%d failed), %d refreshes, %d connections accepted, %d open when the calls ended", calls.Load(), failed.Load(), turn.Load(), accepted, open())
	if turn.Load() < 5 {
		t.Fatalf("only %d refreshes while calls ran", turn.Load())
	}
	rt.CloseIdleConnections()
	deadline = time.Now().Add(3 * time.Second)
	for open() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the churn and CloseIdleConnections, want 0", open())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestALetGoLanesIdleConnectionsCloseAtOnce: a lane let go while streams
// are open on some of its connections (one awaiting its headers, one its
// body) has its idle connections closed at once, and each busy one once
// its own stream ends, not when the lane's last stream ends. The server
// allows one stream a connection, so that over HTTP/2 too each stream has
// a connection of its own.
func TestALetGoLanesIdleConnectionsCloseAtOnce(t *testing.T) {
	for _, major := range []int{2, 1} {
		t.Run(fmt.Sprintf("HTTP_%d", major), func(t *testing.T) {
			var open atomic.Int64
			body, headers, arrived := make(chan struct{}), make(chan struct{}), make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var held chan struct{}
				switch r.URL.Path {
				case "/headers":
					close(arrived)
					held = headers
				case "/body":
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
					held = body
				}
				if held != nil {
					select {
					case <-held:
					case <-r.Context().Done():
					}
				}
				io.WriteString(w, "ok")
			}))
			srv.EnableHTTP2 = true
			srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1}
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				switch s {
				case http.StateNew:
					open.Add(1)
				case http.StateClosed, http.StateHijacked:
					open.Add(-1)
				}
			}
			srv.StartTLS()
			defer srv.Close()
			var once sync.Once
			release := func() { once.Do(func() { close(headers) }) }
			var wg sync.WaitGroup
			var b *http.Response
			defer func() { // first: Close waits for the handlers
				release()
				select {
				case <-body:
				default:
					close(body)
				}
				wg.Wait()
				if b != nil {
					readClose(b)
				}
			}()
			waitOpen := func(n int64, what string) {
				t.Helper()
				deadline := time.Now().Add(3 * time.Second)
				for open.Load() != n {
					if time.Now().After(deadline) {
						t.Fatalf("%s: %d connections open, want %d", what, open.Load(), n)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}

			base := connsClient(&connReplica{srv: srv}, major)
			p := newLanePool(base, srv.Listener.Addr().String(), nil, new(letGo))
			defer p.CloseIdleConnections()
			a := connsGet(t, p, "/body", major)
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, "https://example.com/headers", nil)
				var err error
				if b, err = p.RoundTrip(req); err != nil {
					t.Errorf("GET /headers: %v", err)
				}
			})
			<-arrived
			readClose(connsGet(t, p, "/", major)) // on a third connection, idle after
			waitOpen(3, "three streams, each on a connection of its own")

			p.CloseIdleConnections() // the lane is let go
			waitOpen(2, "the idle connection, once the lane was let go")
			close(body)
			readClose(a)
			waitOpen(1, "the connection whose stream ended, while another's is open")
			release()
			wg.Wait()
			if b != nil {
				readClose(b)
				b = nil
			}
			waitOpen(0, "the last connection, after its stream")
		})
	}
}
