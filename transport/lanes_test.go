package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// replica is one server of a fleet: it counts its hits, records which
// call (the X-Call header) reached it, and answers with status after
// delay, both settable while it serves.
type replica struct {
	name   string
	f      *fleet
	hits   atomic.Int64
	status atomic.Int64 // 0: 200
	delay  atomic.Int64 // ns
	// slowFirst: the first arrival of each call waits this long instead.
	slowFirst atomic.Int64
	// retryAfter, with a status, is the Retry-After it answers with.
	retryAfter atomic.Value // string
	host       atomic.Value // string: the Host of the last request
}

func (r *replica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.hits.Add(1)
	r.host.Store(req.Host)
	first := r.f.arrive(req.Header.Get("X-Call"), r.name)
	d := time.Duration(r.delay.Load())
	if s := time.Duration(r.slowFirst.Load()); s > 0 && first {
		d = s
	}
	if d > 0 {
		select {
		case <-time.After(d):
		case <-req.Context().Done():
			return
		}
	}
	if s := int(r.status.Load()); s != 0 {
		if ra, _ := r.retryAfter.Load().(string); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(s)
	}
	io.WriteString(w, r.name)
}

// fleet is the replicas of a test, on an in-memory network.
type fleet struct {
	net  httptestutil.Network
	reps map[string]*replica

	mu    sync.Mutex
	calls map[string][]string // X-Call → the replicas it reached, in order
}

func newFleet() *fleet {
	return &fleet{reps: map[string]*replica{}, calls: map[string][]string{}}
}

// serve serves addr with one replica per name, placed per connection.
func (f *fleet) serve(addr string, names ...string) {
	var hs []http.Handler
	for _, n := range names {
		r := &replica{name: n, f: f}
		f.reps[n] = r
		hs = append(hs, r)
	}
	f.net.Listen(addr, hs...)
}

// arrive records call reaching replica name, and reports whether it is
// the call's first arrival anywhere.
func (f *fleet) arrive(call, name string) bool {
	if call == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[call] = append(f.calls[call], name)
	return len(f.calls[call]) == 1
}

func (f *fleet) hits(names ...string) []int64 {
	var h []int64
	for _, n := range names {
		h = append(h, f.reps[n].hits.Load())
	}
	return h
}

// laneGet sends GET url through rt as call id, reads the body, and returns
// the status, or the error.
func laneGet(t *testing.T, rt http.RoundTripper, url, id string) (int, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		req.Header.Set("X-Call", id)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// newLaneTransport returns a Transport over f's network with set, and a
// cleanup that closes its connections and the network's servers.
func newLaneTransport(t *testing.T, f *fleet, cfg Config) *Transport {
	t.Helper()
	cfg.Base = f.net.Transport()
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.CloseIdleConnections()
		f.net.Close()
	})
	return rt
}

var four = []string{"a:80", "b:80", "c:80", "d:80"}

// prime makes rt's first call to url, which starts the key's first
// refresh of its Endpoints, and waits for the refresh to end. The call
// goes to the request's own address, or, when the refresh's goroutine
// ends before the call picks its lane, to a lane of Endpoints' answer:
// a test that counts a replica's hits counts them from after prime.
func prime(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	laneGet(t, rt, url, "")
	synctest.Wait()
}

// serveFour serves a:80 ... d:80 with replicas a ... d.
func (f *fleet) serveFour() {
	for _, a := range four {
		f.serve(a, a[:1])
	}
}

func TestConnectionLanesSpreadOverABalancedFleet(t *testing.T) {
	for _, tt := range []struct {
		name     string
		replicas *policy.Replicas
	}{{"off", nil}, {"four connections", &policy.Replicas{}}} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				f.serve("api:80", "a", "b", "c", "d")
				rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: tt.replicas}})
				for i := range 400 {
					if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
						t.Fatalf("call %d: %d, %v", i, code, err)
					}
				}
				hits := f.hits("a", "b", "c", "d")
				reached := 0
				for _, h := range hits {
					if h > 0 {
						reached++
					}
				}
				switch {
				case tt.replicas == nil && reached != 1:
					t.Errorf("one pool reached %d replicas %v, want 1 (one kept-alive connection)", reached, hits)
				case tt.replicas != nil && slices.Min(hits) < 50:
					t.Errorf("four lanes' hits %v, want every replica well used", hits)
				}
			})
		})
	}
}

func TestOneBadReplicaOfFourDoesNotOpenTheKeysBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own") // the first call's, before Endpoints answers: a failure there would be the breaker's
		f.serveFour()
		var opened atomic.Int64
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Breaker:  &policy.Breaker{},
				Replicas: &policy.Replicas{Endpoints: Static(four...)},
			},
			Observer: &policy.Observer{BreakerTransition: func(b policy.BreakerTransition) {
				if b.To == policy.BreakerOpen {
					opened.Add(1)
				}
			}},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		f.reps["d"].status.Store(http.StatusInternalServerError)
		failed := 0
		for range 2000 {
			time.Sleep(10 * time.Millisecond)
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
				failed++
			}
		}
		if n := opened.Load(); n != 0 {
			t.Errorf("one bad replica of four opened the key's breaker %d times", n)
		}
		if failed > 0 {
			t.Errorf("%d of 2000 calls failed with one bad replica of four and retries to other lanes", failed)
		}
		if d := f.reps["d"].hits.Load(); d > 100 {
			t.Errorf("the bad replica got %d of about 2000 attempts, want it ejected", d)
		}
		// The breaker learned the first failure of each run on d, not the
		// ones its lane explains (all of them, with explanations off).
		if r := rt.scopes.lookup("api").breaker.Rate(time.Now()); r.Failures*2 > uint64(f.reps["d"].hits.Load()) {
			t.Errorf("the key's breaker counted %d failures of the %d on the bad replica, want under half", r.Failures, f.reps["d"].hits.Load())
		}

		// Every replica failing is the host failing: the breaker opens.
		for _, r := range f.reps {
			r.status.Store(http.StatusInternalServerError)
		}
		for range 100 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
			if opened.Load() > 0 {
				break
			}
		}
		if opened.Load() == 0 {
			t.Error("every replica failing did not open the key's breaker")
		}
	})
}

func TestARetryGoesToALaneItsCallHasNotUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 4,
			Budget:   policy.Budget{Ratio: -1}, // off: every retry is sent
			Retry:    &policy.Retry{BaseDelay: time.Millisecond},
			Replicas: &policy.Replicas{Endpoints: Static(four...), MaxEjected: -1},
		}})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.status.Store(http.StatusServiceUnavailable)
		}
		for i := range 50 {
			laneGet(t, rt, "http://api/", strconv.Itoa(i))
		}
		for call, reached := range f.calls {
			if len(reached) != 4 {
				t.Fatalf("call %s made %d attempts, want 4", call, len(reached))
			}
			if distinct := len(slices.Compact(slices.Sorted(slices.Values(reached)))); distinct != 4 {
				t.Errorf("call %s's four attempts reached %v, want four replicas", call, reached)
			}
		}
		for name, r := range f.reps {
			if h, _ := r.host.Load().(string); h != "api" {
				t.Errorf("replica %s was asked for host %q, want the request's, api", name, h)
			}
		}
	})
}

func TestAHedgeGoesToAnotherLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 2,
			Budget:   policy.Budget{Ratio: -1},
			Hedge:    &policy.Hedge{Quantile: 0.5, MaxConcurrent: 2},
			Replicas: &policy.Replicas{Endpoints: Static(four...)},
		}})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		for i := range 100 {
			laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
		}
		for _, r := range f.reps {
			r.slowFirst.Store(int64(100 * time.Millisecond))
		}
		for i := range 100 {
			laneGet(t, rt, "http://api/", strconv.Itoa(i))
		}
		synctest.Wait() // the losers' cancellation reaches the replicas
		hedged := 0
		for i := range 100 {
			reached := f.calls[strconv.Itoa(i)]
			if len(reached) == 2 {
				hedged++
				if reached[0] == reached[1] {
					t.Errorf("call %d's hedge went back to replica %s", i, reached[0])
				}
			}
		}
		if hedged < 90 {
			t.Errorf("%d of 100 calls slow on their first leg were hedged, want nearly all", hedged)
		}
		if n := rt.scopes.lookup("api").lanes.Counts(time.Now()).InFlight; n != 0 {
			t.Errorf("%d attempts in flight on the lanes after every call ended, want 0: the losers' lanes were not told", n)
		}
	})
}

func TestPickingAvoidsASlowReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Replicas: &policy.Replicas{Endpoints: Static(four...)},
		}})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		f.reps["d"].delay.Store(int64(50 * time.Millisecond))
		for range 1000 {
			laneGet(t, rt, "http://api/", "")
		}
		if d := f.reps["d"].hits.Load(); d > 50 {
			t.Errorf("the slow replica got %d of 1000 calls, want under 5%%: %v", d, f.hits("a", "b", "c", "d"))
		}
	})
}

func TestConnectionLanesOnASlowReplicaAreEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Behind a balancer, two of four connection lanes land on slow
		// replicas: a pick that draws both has no fast lane to take.
		f := newFleet()
		f.serve("api:80", "slow1", "fast1", "slow2", "fast2")
		for n, r := range f.reps {
			r.delay.Store(int64(2 * time.Millisecond))
			if strings.HasPrefix(n, "slow") {
				r.delay.Store(int64(40 * time.Millisecond))
			}
		}
		var mu sync.Mutex
		var reasons []policy.EjectionReason
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{Replicas: &policy.Replicas{}},
			Observer: &policy.Observer{LaneEjected: func(e policy.LaneEjection) {
				mu.Lock()
				defer mu.Unlock()
				reasons = append(reasons, e.Reason)
			}},
		})
		slow := func() int64 { return f.reps["slow1"].hits.Load() + f.reps["slow2"].hits.Load() }
		for range 300 {
			laneGet(t, rt, "http://api/", "")
		}
		before := slow()
		for range 300 {
			laneGet(t, rt, "http://api/", "")
		}
		if got := slow() - before; got != 0 {
			t.Errorf("the slow replicas got %d of the last 300 calls, want none", got)
		}
		// One slow lane ejected, the other is drawn only beside a fast
		// one, and left alone.
		if len(reasons) == 0 || slices.ContainsFunc(reasons, func(r policy.EjectionReason) bool { return r != policy.EjectLatency }) {
			t.Errorf("ejections %v, want one or two, for latency", reasons)
		}
	})
}

func TestAnEjectedLaneGetsTrafficAgainAfterItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		var ejected atomic.Int64
		var mu sync.Mutex
		var events []string
		record := func(what string) func(policy.LaneEjection) {
			return func(e policy.LaneEjection) {
				mu.Lock()
				defer mu.Unlock()
				events = append(events, what+" "+e.Key+" "+e.Addr+" "+strconv.Itoa(e.Index)+" "+e.Reason.String()+" "+e.For.String())
			}
		}
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Attempts: 4,
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Replicas: &policy.Replicas{Endpoints: Static(four...)},
			},
			Observer: &policy.Observer{LaneEjected: record("ejected"), LaneReturned: record("returned")},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		// The picker sends little to a lane that failed (a failure is a
		// sample twice as slow as the slowest other lane, and decays in
		// about 7 s), so its fifth failure in a row takes a while.
		f.reps["d"].status.Store(http.StatusBadGateway)
		for range 10000 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
			if m := rt.Measured("api"); m.LanesEjected > 0 {
				ejected.Store(int64(m.LanesEjected))
				break
			}
		}
		if ejected.Load() != 1 {
			t.Fatalf("the failing replica was not ejected: %+v", rt.Measured("api"))
		}
		f.reps["d"].status.Store(0)
		before := f.reps["d"].hits.Load()
		time.Sleep(30 * time.Second)
		for range 400 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
		}
		if m := rt.Measured("api"); m.LanesEjected != 0 || m.Lanes != 4 {
			t.Errorf("after its ejection: %d of %d lanes ejected, want 0 of 4", m.LanesEjected, m.Lanes)
		}
		if got := f.reps["d"].hits.Load() - before; got < 50 {
			t.Errorf("the replica back from ejection got %d of 400 calls, want its share", got)
		}
		want := []string{"ejected api d:80 3 consecutive 30s", "returned api d:80 3 consecutive 30s"}
		if !slices.Equal(events, want) {
			t.Errorf("observed %q, want %q", events, want)
		}
	})
}

// TestALaneEjectedAgainAtItsReturnIsObservedInOrder: with one failure
// enough to eject, the first attempt on a lane back from its ejection
// fails and ejects it again; the observer is told of the return, then of
// the new ejection, so that a log read in order ends with the lane out.
func TestALaneEjectedAgainAtItsReturnIsObservedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		var mu sync.Mutex
		var events []string
		record := func(what string) func(policy.LaneEjection) {
			return func(e policy.LaneEjection) {
				mu.Lock()
				defer mu.Unlock()
				events = append(events, what+" "+e.Addr+" "+e.Reason.String()+" "+e.For.String())
			}
		}
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static(four...), ConsecutiveFailures: 1}},
			Observer: &policy.Observer{LaneEjected: record("ejected"), LaneReturned: record("returned")},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
		}
		d := f.reps["d"]
		d.status.Store(http.StatusBadGateway)
		for range 1000 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
			if rt.Measured("api").LanesEjected > 0 {
				break
			}
		}
		time.Sleep(30 * time.Second)
		before := d.hits.Load()
		for range 1000 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
			if d.hits.Load() > before {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		want := []string{"ejected d:80 consecutive 30s", "returned d:80 consecutive 30s", "ejected d:80 consecutive 1m0s"}
		if !slices.Equal(events, want) {
			t.Errorf("observed %q, want %q", events, want)
		}
	})
}

// scripted is a Resolver whose answers a test gives one by one.
type scripted struct {
	asked   chan string
	answers chan answer
}

type answer struct {
	addrs []string
	err   error
}

func (s *scripted) Resolve(ctx context.Context, hostport string) ([]string, error) {
	s.asked <- hostport
	select {
	case a := <-s.answers:
		return a.addrs, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestEndpointsRefreshKeepsTheLastGoodSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.serveFour()
		r := &scripted{asked: make(chan string, 1), answers: make(chan answer)}
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Replicas: &policy.Replicas{Endpoints: r, Refresh: 30 * time.Second},
		}})
		calls := 0
		reached := func(n int) []string {
			t.Helper()
			var got []string
			for range n {
				calls++
				id := strconv.Itoa(calls)
				if code, err := laneGet(t, rt, "http://api/", id); err != nil || code != 200 {
					t.Fatalf("%d, %v", code, err)
				}
				got = append(got, f.calls[id]...)
			}
			return slices.Compact(slices.Sorted(slices.Values(got)))
		}
		// The first call asks, and does not wait for the answer.
		if got := reached(10); !slices.Equal(got, []string{"own"}) {
			t.Fatalf("before any answer, calls reached %v, want the request's own address", got)
		}
		if hp := <-r.asked; hp != "api:80" {
			t.Fatalf("Resolve asked for %q, want api:80", hp)
		}
		r.answers <- answer{err: errors.New("no answer")}
		synctest.Wait()
		if got := reached(10); !slices.Equal(got, []string{"own"}) {
			t.Fatalf("after a failed first answer, calls reached %v, want the request's own address", got)
		}
		time.Sleep(time.Second) // the retry's wait
		reached(1)
		<-r.asked
		r.answers <- answer{addrs: []string{"a:80", "b:80"}}
		synctest.Wait()
		if got := reached(20); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("after the answer a, b: calls reached %v", got)
		}
		time.Sleep(30 * time.Second)
		reached(1)
		<-r.asked
		r.answers <- answer{err: errors.New("no answer")}
		synctest.Wait()
		if got := reached(20); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("after a failed refresh: calls reached %v, want the last good set a, b", got)
		}
		time.Sleep(time.Second)
		reached(1)
		<-r.asked
		r.answers <- answer{addrs: []string{}}
		synctest.Wait()
		if got := reached(20); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("after an empty refresh: calls reached %v, want the last good set a, b", got)
		}
		time.Sleep(2 * time.Second)
		reached(1)
		<-r.asked
		r.answers <- answer{addrs: []string{"c:80"}}
		synctest.Wait()
		if got := reached(20); !slices.Equal(got, []string{"c"}) {
			t.Fatalf("after the answer c: calls reached %v", got)
		}
		synctest.Wait()
		if _, open := f.net.Conns(); open != 1 {
			t.Errorf("%d connections open after a and b left, want 1, c's: drained lanes close theirs", open)
		}
	})
}

func TestLanesComeAndGoWhileCallsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		names := []string{"a", "b", "c", "d", "e", "f"}
		for _, n := range names {
			f.serve(n+":80", n)
		}
		var turn atomic.Int64
		sets := [][]string{{"a:80", "b:80"}, {"b:80", "c:80", "d:80"}, {"e:80"}, {"f:80", "a:80", "c:80"}}
		rotating := resolverFunc(func(context.Context, string) ([]string, error) {
			return sets[turn.Add(1)%int64(len(sets))], nil
		})
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Replicas: &policy.Replicas{Endpoints: rotating, Refresh: 20 * time.Millisecond},
		}})
		for _, r := range f.reps {
			r.delay.Store(int64(3 * time.Millisecond))
		}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range 8 {
			wg.Go(func() {
				for range 200 {
					if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := failed.Load(); n != 0 {
			t.Errorf("%d calls failed while lanes came and went", n)
		}
		if turn.Load() < 20 {
			t.Errorf("only %d refreshes while calls ran", turn.Load())
		}
	})
}

type resolverFunc func(context.Context, string) ([]string, error)

func (f resolverFunc) Resolve(ctx context.Context, hp string) ([]string, error) { return f(ctx, hp) }

func TestDNSResolvesLocalhost(t *testing.T) {
	addrs, err := DNS().Resolve(context.Background(), "localhost:8080")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(addrs, func(a string) bool { return a == "127.0.0.1:8080" || a == "[::1]:8080" }) {
		t.Errorf("DNS().Resolve(localhost:8080) = %v, want a loopback address on port 8080", addrs)
	}
	if _, err := DNS().Resolve(context.Background(), "no port"); err == nil {
		t.Error("DNS().Resolve of an address with no port did not fail")
	}
}

func TestStaticAnswersACopy(t *testing.T) {
	addrs := []string{"a:1", "b:2"}
	r := Static(addrs...)
	addrs[0] = "edited"
	got, _ := r.Resolve(context.Background(), "any:80")
	got[1] = "edited too"
	again, _ := r.Resolve(context.Background(), "any:80")
	if !slices.Equal(again, []string{"a:1", "b:2"}) {
		t.Errorf("Static answered %v, want a:1 b:2 whatever its callers edit", again)
	}
}

func TestNewRefusesReplicasOverABaseThatIsNotAnHTTPTransport(t *testing.T) {
	_, err := New(Config{
		Base:     fakeRT(func(*http.Request) (*http.Response, error) { return nil, errors.New("unused") }),
		Policies: policy.Set{Replicas: &policy.Replicas{}},
		PerKey:   map[string]policy.Set{"b": {Replicas: &policy.Replicas{}}, "c": {}},
	})
	if err == nil {
		t.Fatal("New accepted Replicas over a fakeRT")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "transport: Policies: Replicas needs a Base that is an *http.Transport") ||
		!strings.HasPrefix(lines[1], `transport: PerKey["b"]: Replicas needs`) {
		t.Errorf("New's error:\n%v\nwant one line for Policies and one for PerKey[\"b\"]", err)
	}
	if _, err := New(Config{Base: new(http.Transport), Policies: policy.Set{Replicas: &policy.Replicas{}}}); err != nil {
		t.Errorf("New refused Replicas over an *http.Transport: %v", err)
	}
}

func TestCloseIdleConnectionsAndEvictionReachEveryLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "a", "b", "c", "d")
		f.serve("other:80", "o")
		rt := newLaneTransport(t, f, Config{MaxKeys: 1, Policies: policy.Set{Replicas: &policy.Replicas{}}})
		for range 100 {
			laneGet(t, rt, "http://api/", "")
		}
		synctest.Wait()
		if _, open := f.net.Conns(); open != 4 {
			t.Fatalf("%d connections open after 100 calls on four lanes, want 4", open)
		}
		rt.CloseIdleConnections()
		synctest.Wait()
		if _, open := f.net.Conns(); open != 0 {
			t.Fatalf("%d connections open after CloseIdleConnections, want 0", open)
		}
		for range 100 {
			laneGet(t, rt, "http://api/", "")
		}
		laneGet(t, rt, "http://other/", "") // evicts api, MaxKeys being 1
		synctest.Wait()
		if _, open := f.net.Conns(); open != 1 {
			t.Errorf("%d connections open after api was evicted, want 1, other's", open)
		}
	})
}

// BenchmarkLanes compares a call through one pool with a call through
// four connection lanes, over the in-memory network (HTTP/1.1, kept
// alive): what picking, and telling the lane, cost a call.
func BenchmarkLanes(b *testing.B) {
	for _, bb := range []struct {
		name     string
		replicas *policy.Replicas
	}{{"off", nil}, {"on", &policy.Replicas{}}} {
		b.Run(bb.name, func(b *testing.B) {
			var n httptestutil.Network
			n.Listen("api:80", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
			defer n.Close()
			rt, err := New(Config{Base: n.Transport(), Policies: policy.Set{Replicas: bb.replicas}})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

func TestARetryAfterFromOneLaneHoldsTheLaneNotTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		// No Retry: a retry would wait out the Retry-After itself.
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Throttler: &policy.Throttler{},
			Replicas:  &policy.Replicas{Endpoints: Static(four...), ConsecutiveFailures: -1},
		}})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(time.Millisecond))
			r.hits.Store(0) // prime's call may have gone to b, with a 200
		}
		b := f.reps["b"]
		b.retryAfter.Store("6") // a probe may try it after 5 s: Retry-After counts whole seconds
		b.status.Store(http.StatusServiceUnavailable)
		for range 100 {
			laneGet(t, rt, "http://api/", "")
			if b.hits.Load() > 0 {
				break
			}
		}
		if b.hits.Load() != 1 {
			t.Fatalf("replica b got %d attempts, want the one that pushed back", b.hits.Load())
		}
		b.status.Store(0)
		if m := rt.Measured("api"); m.PushbackLeft != 0 {
			t.Errorf("one lane's Retry-After pushed the key back for %v", m.PushbackLeft)
		}
		for range 400 {
			time.Sleep(10 * time.Millisecond) // 4 s, within the hold
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
				t.Fatalf("%d, %v", code, err)
			}
		}
		if n := b.hits.Load(); n != 1 {
			t.Errorf("replica b got %d attempts while its Retry-After held it, want none beyond the first", n-1)
		}
		time.Sleep(time.Second)
		for range 400 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
		}
		if n := b.hits.Load(); n < 50 {
			t.Errorf("replica b got %d attempts after its hold, want its share back", n-1)
		}
	})
}

// TestAFastFailingReplicaGetsLittleTrafficUnderLoad: with ejection off,
// the picker alone keeps a replica that fails at once from drawing calls
// when the others, slower, have attempts outstanding (their cost rises
// with them; a run of failures outweighs it), and the breaker closed.
func TestAFastFailingReplicaGetsLittleTrafficUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		var opened atomic.Int64
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Breaker:  &policy.Breaker{},
				Replicas: &policy.Replicas{Endpoints: Static(four...), MaxEjected: -1},
			},
			Observer: &policy.Observer{BreakerTransition: func(b policy.BreakerTransition) {
				if b.To == policy.BreakerOpen {
					opened.Add(1)
				}
			}},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.delay.Store(int64(10 * time.Millisecond))
		}
		d := f.reps["d"]
		d.delay.Store(0)
		d.status.Store(http.StatusInternalServerError)
		var wg sync.WaitGroup
		var calls, failed atomic.Int64
		for range 16 {
			wg.Go(func() {
				for range 6000 { // a minute
					calls.Add(1)
					if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := opened.Load(); n != 0 {
			t.Errorf("a bad replica of four, never ejected, opened the key's breaker %d times (%d of %d calls failed)", n, failed.Load(), calls.Load())
		}
		if share := float64(d.hits.Load()) / float64(calls.Load()); share > 0.001 {
			t.Errorf("the replica failing at once got %.2f%% of %d calls from 16 callers, want under 0.1%%", 100*share, calls.Load())
		}
	})
}

// TestAConnectionLaneOnABadReplicaIsDialedAnew: behind a balancer, a
// connection lane whose connection landed on a failing replica fails in a
// row while the others succeed; it closes its idle connection and dials
// again, so that the balancer places it anew (here on the next replica in
// turn, a fifth), rather than staying on the bad one until it is ejected.
// One connection a lane, so that placements are the network's turns.
func TestAConnectionLaneOnABadReplicaIsDialedAnew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "bad", "a", "b", "c", "e")
		for _, r := range f.reps {
			r.delay.Store(int64(2 * time.Millisecond))
		}
		f.reps["bad"].status.Store(http.StatusServiceUnavailable)
		var ejected atomic.Int64
		base := f.net.Transport()
		base.MaxConnsPerHost = 1
		rt, err := New(Config{
			Base:     base,
			Policies: policy.Set{Replicas: &policy.Replicas{}},
			Observer: &policy.Observer{LaneEjected: func(policy.LaneEjection) { ejected.Add(1) }},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rt.CloseIdleConnections()
			f.net.Close()
		})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 200 {
					laneGet(t, rt, "http://api/", "")
				}
			})
		}
		wg.Wait()
		if bad, e := f.reps["bad"].hits.Load(), f.reps["e"].hits.Load(); bad >= 5 || e == 0 || ejected.Load() != 0 {
			t.Errorf("the bad replica got %d calls, the fifth %d, with %d ejections; want under 5, some, and none: the lane on the bad replica dialed anew", bad, e, ejected.Load())
		}
	})
}

// TestAnAddressLaneDialsItsAddress: whichever dial func the base sets,
// an address lane's pool dials the lane's address in place of the
// request's, and uses no proxy; a connection lane's pool dials as the base.
func TestAnAddressLaneDialsItsAddress(t *testing.T) {
	errDialed := errors.New("dialed")
	var got []string
	dialCtx := func(_ context.Context, _, addr string) (net.Conn, error) {
		got = append(got, addr)
		return nil, errDialed
	}
	dial := func(_, addr string) (net.Conn, error) { got = append(got, addr); return nil, errDialed }
	proxy := func(*http.Request) (*url.URL, error) { return url.Parse("http://proxy:3128") }
	for _, tt := range []struct {
		name string
		base *http.Transport
		tls  bool
	}{
		{"DialContext", &http.Transport{DialContext: dialCtx, Proxy: proxy}, false},
		//lint:ignore SA1019 a base may still set it
		{"Dial", &http.Transport{Dial: dial}, false},
		{"DialTLSContext", &http.Transport{DialTLSContext: dialCtx}, true},
		//lint:ignore SA1019 a base may still set it
		{"DialTLS", &http.Transport{DialTLS: dial}, true},
	} {
		got = nil
		p := newPoolTransport(tt.base, "10.0.0.7:8443", nil)
		if p.Proxy != nil {
			t.Errorf("%s: an address lane keeps the base's Proxy", tt.name)
		}
		switch {
		case !tt.tls:
			_, err := p.DialContext(context.Background(), "tcp", "api:443")
			if !errors.Is(err, errDialed) || !slices.Equal(got, []string{"10.0.0.7:8443"}) {
				t.Errorf("%s: the lane dialed %v (%v), want 10.0.0.7:8443 through the base's func", tt.name, got, err)
			}
		case p.DialTLSContext != nil:
			p.DialTLSContext(context.Background(), "tcp", "api:443")
		default:
			//lint:ignore SA1019 a base may still set it
			p.DialTLS("tcp", "api:443")
		}
		if tt.tls && !slices.Equal(got, []string{"10.0.0.7:8443"}) {
			t.Errorf("%s: the lane's TLS dial went to %v, want 10.0.0.7:8443", tt.name, got)
		}
	}
	got = nil
	p := newPoolTransport(&http.Transport{DialContext: dialCtx, Proxy: proxy}, "", nil)
	p.DialContext(context.Background(), "tcp", "api:443")
	if p.Proxy == nil || !slices.Equal(got, []string{"api:443"}) {
		t.Errorf("a connection lane dialed %v (proxy kept: %v), want api:443 as the base, with its proxy", got, p.Proxy != nil)
	}
}

func TestASnapshotOfLanesAllocatesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serveFour()
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static(four...)}}})
		prime(t, rt, "http://api/")
		laneGet(t, rt, "http://api/", "")
		if m := rt.Measured("api"); !m.HasReplicas || m.Lanes != 4 || m.LanesEjected != 0 || m.LanesIgnored != 0 {
			t.Errorf("Measured: HasReplicas %v, %d lanes, %d ejected, %d ignored; want true, 4, 0, 0", m.HasReplicas, m.Lanes, m.LanesEjected, m.LanesIgnored)
		}
		if n := testing.AllocsPerRun(100, func() { rt.Measured("api") }); n != 0 {
			t.Errorf("Measured of a key with lanes allocates %v times, want 0", n)
		}
	})
}

// TestLanesAllocateNothingOfTheirOwn: a call over four connection lanes
// allocates what the same call over the base does. Each pool, and the
// base, answer from a RoundTripper registered for "http", so that only
// resilix's own path differs.
func TestLanesAllocateNothingOfTheirOwn(t *testing.T) {
	ok := fakeRT(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})
	measure := func(set policy.Set) float64 {
		base := new(http.Transport)
		base.RegisterProtocol("http", ok)
		rt, err := New(Config{Base: base, Policies: set})
		if err != nil {
			t.Fatal(err)
		}
		s := rt.scopes.enter("api", time.Now())
		s.leave()
		if s.lanes != nil {
			s.lanes.Pools(func(p *lanePool) { p.cur.Load().t.RegisterProtocol("http", ok) })
		}
		req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
		return testing.AllocsPerRun(1000, func() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		})
	}
	for _, set := range []policy.Set{
		{},
		{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}},
	} {
		off := measure(set)
		set.Replicas = &policy.Replicas{}
		on := measure(set)
		if on != off {
			t.Errorf("a call allocates %v times over lanes, %v over the base, want the same (Retry set: %v)", on, off, set.Retry != nil)
		}
	}
}

// BenchmarkLanesOverhead is what lanes add to a call, without the wire:
// the base and each lane's pool answer from a RoundTripper registered for
// "http" (no dial, no connection), so that only resilix's path differs:
// a pick, two clock reads and the lane's Done.
func BenchmarkLanesOverhead(b *testing.B) {
	ok := fakeRT(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})
	timed := policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}, Timeout: &policy.Timeout{PerAttempt: time.Second}}
	for _, bb := range []struct {
		name string
		set  policy.Set
	}{
		{"off", policy.Set{}},
		{"on", policy.Set{Replicas: &policy.Replicas{}}},
		// A chain that reads the clock around the wire anyway: the
		// lane reuses its readings.
		{"retry+breaker+timeout/off", timed},
		{"retry+breaker+timeout/on", func(s policy.Set) policy.Set { s.Replicas = &policy.Replicas{}; return s }(timed)},
	} {
		b.Run(bb.name, func(b *testing.B) {
			base := new(http.Transport)
			base.RegisterProtocol("http", ok)
			rt, err := New(Config{Base: base, Policies: bb.set})
			if err != nil {
				b.Fatal(err)
			}
			s := rt.scopes.enter("api", time.Now())
			s.leave()
			if s.lanes != nil {
				s.lanes.Pools(func(p *lanePool) { p.cur.Load().t.RegisterProtocol("http", ok) })
			}
			req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, _ := rt.RoundTrip(req)
				resp.Body.Close()
			}
		})
	}
}
