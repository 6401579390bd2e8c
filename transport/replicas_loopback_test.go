package transport_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestReplicas measures how resilix treats a host that is a fleet of four
// replicas, one of them degraded, over real loopback sockets, beside bare
// net/http and resilix without Replicas, and checks the Replicas row
// against DESIGN.md §8's targets. It runs only when RESILIX_REPLICAS is
// set: to 1, or to a Go duration that replaces the 6s of each case
// (`make replicas` sets it). It prints one table per case.
//
// Paths: direct (the requests name the first replica's address, and
// Replicas' Endpoints is a static list of the four), l4 (a TCP balancer
// written here, which places each connection on a replica drawn at
// random, as kube-proxy does; Replicas is the zero value, four connection
// lanes), and haproxy (the same with HAProxy in TCP mode, balance random,
// in front; skipped when haproxy is not in PATH). Each over HTTP/1.1 and
// h2c (prior knowledge).
//
// Cases, in order, per path and protocol: none degraded (the reference);
// the first replica 20× slower than the others; the first replica
// answering 503 to a seeded half of its calls; every replica answering
// 503. The degraded replica is the first one, the one the direct path's
// requests name, so that without Replicas it gets every call.
//
// Each row (net/http, resilix, resilix with Replicas) has four replicas
// of its own (and a balancer of its own), with the same seeds in every
// row (a replica's 503 draws, the balancer's placements in the order
// connections arrive), and the three rows run side by side, at the same time, so that a case takes its length once. A row is
// a fleet of six clients, each with its own base *http.Transport (so its
// own pool) and, for resilix, its own Transport (so its own breaker), and
// four callers each; callers are paced (a fixed period, no catching up on
// a backlog) at replCallsPerSec a row in all, and each call has a 5s
// deadline.
//
// Each case begins with a warm-up of replWarmUp, before any lane has a
// latency sample, which no figure counts but the key's breaker openings
// and the lane ejections: the calls started in it, and the replicas'
// requests, answers and connections until its end, are left out. A case's
// length is what is measured, after the warm-up.
func TestReplicas(t *testing.T) {
	d := optIn(t, "RESILIX_REPLICAS", 6*time.Second, "a loopback measurement of a host of four replicas, one degraded; set RESILIX_REPLICAS=1 (or a duration for each case) to run it, as make replicas does")
	// The p99 of case 1 for each path, protocol and row, which case 2's
	// target is relative to.
	ref := map[string]time.Duration{}
	for _, path := range []string{"direct", "l4", "haproxy"} {
		for _, proto := range []string{"h1", "h2c"} {
			t.Run(path+"/"+proto, func(t *testing.T) {
				if path == "haproxy" {
					if _, err := exec.LookPath("haproxy"); err != nil {
						t.Skip("haproxy is not in PATH")
					}
				}
				for _, c := range replCases() {
					t.Run(c.name, func(t *testing.T) { replRun(t, path, proto, c, d, ref) })
				}
			})
		}
	}
}

const (
	replReplicas    = 4
	replClients     = 6
	replCallers     = 4 // per client
	replCallsPerSec = 300
	replCallTimeout = 5 * time.Second
	replFast        = 2 * time.Millisecond
	replSlow        = 20 * replFast
	replWarmUp      = time.Second
)

// replCase is how the degraded replica (the first) and the others answer.
type replCase struct {
	name     string
	slow     bool    // the degraded replica answers after replSlow, the others after replFast
	failHalf bool    // the degraded replica answers 503 to a seeded half of its calls
	failAll  bool    // every replica answers 503
	check    replChk // the targets of the Replicas row
}

type replChk func(tb *figureTable, r replResult, ref time.Duration, haveRef bool)

func replCases() []replCase {
	return []replCase{
		{name: "1-none-degraded"},
		{name: "2-slow", slow: true, check: func(tb *figureTable, r replResult, ref time.Duration, haveRef bool) {
			tb.check(r.degShare() <= 0.02, "slow replica: it answered %.2f%% of the replicas' answers, target <= 2%%", 100*r.degShare())
			if haveRef {
				tb.check(float64(r.p99) <= 1.5*float64(ref), "slow replica: p99 %v, target <= 1.5 × case 1's %v = %v", replMS(r.p99), replMS(ref), replMS(time.Duration(1.5*float64(ref))))
			} else {
				tb.note("slow replica: no case 1 p99 to compare with (run the whole path)")
			}
			tb.check(r.wirePerCall() <= 1.15, "slow replica: %.3f wire calls per call, target <= 1.15", r.wirePerCall())
		}},
		{name: "3-half-503", failHalf: true, check: func(tb *figureTable, r replResult, _ time.Duration, _ bool) {
			tb.check(r.success() >= 0.995, "half-503 replica: %s of calls succeeded, target >= 99.5%%", pct(r.oks, r.calls))
			tb.check(r.opens() == 0, "half-503 replica: the key's breaker opened %d times (per client %v), target 0", r.opens(), r.opensPer)
			tb.check(r.wirePerCall() <= 1.2, "half-503 replica: %.3f wire calls per call, target <= 1.2", r.wirePerCall())
		}},
		{name: "4-all-503", failAll: true, check: func(tb *figureTable, r replResult, _ time.Duration, _ bool) {
			tb.check(!slices.Contains(r.opensPer, 0), "all failing: the key's breaker opened in %d of %d clients (openings per client %v), target every one", replCountNonZero(r.opensPer), len(r.opensPer), r.opensPer)
		}},
	}
}

// replRows are the three rows of a table.
var replRows = []string{"net/http", "resilix", "resilix+Replicas"}

// replSet is the chain of the resilix rows.
func replSet() policy.Set {
	return policy.Set{
		Attempts: 3,
		Retry:    &policy.Retry{},
		Hedge:    &policy.Hedge{},
		Breaker:  &policy.Breaker{},
		Timeout:  &policy.Timeout{PerAttempt: time.Second},
	}
}

// replRun runs one case: the three rows side by side for d, then one
// table.
func replRun(t *testing.T, path, proto string, c replCase, d time.Duration, ref map[string]time.Duration) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	type row struct {
		reps  []*replReplica
		proxy interface{ close() } // the balancer, nil on the direct path
		url   string
		key   string
		fleet []*replClient
		load  *replLoad
	}
	rows := make([]*row, len(replRows))
	for i, name := range replRows {
		r := &row{load: &replLoad{}}
		for j := range replReplicas {
			degraded := j == 0
			delay := replFast
			if c.slow && degraded {
				delay = replSlow
			}
			failP := 0.0
			switch {
			case c.failAll:
				failP = 1
			case c.failHalf && degraded:
				failP = 0.5
			}
			r.reps = append(r.reps, newReplReplica(t, delay, failP, uint64(j+1)))
		}
		addrs := make([]string, len(r.reps))
		for j, rep := range r.reps {
			addrs[j] = rep.addr()
		}
		var (
			replicas *policy.Replicas
			proxy    interface{ close() }
		)
		switch path {
		case "direct":
			r.key = addrs[0]
			replicas = &policy.Replicas{Endpoints: transport.Static(addrs...)}
		case "l4":
			b := newReplBalancer(t, addrs, 100)
			proxy, r.key = b, b.addr()
			replicas = &policy.Replicas{}
		case "haproxy":
			h := newReplHAProxy(t, addrs)
			proxy, r.key = h, h.addr
			replicas = &policy.Replicas{}
		}
		r.proxy = proxy
		r.url = "http://" + r.key + "/"
		var set *policy.Set
		switch name {
		case "resilix":
			s := replSet()
			set = &s
		case "resilix+Replicas":
			s := replSet()
			s.Replicas = replicas
			set = &s
		}
		for range replClients {
			r.fleet = append(r.fleet, newReplClient(t, proto, r.key, set))
		}
		rows[i] = r
	}

	ctx, cancel := context.WithCancel(t.Context())
	var waits []func()
	from := time.Now().Add(replWarmUp)
	for _, r := range rows {
		r.load.from = from
		for _, cl := range r.fleet {
			waits = append(waits, r.load.run(ctx, cl, r.url, replCallers, replCallsPerSec/replClients))
		}
	}
	time.Sleep(replWarmUp)
	for _, r := range rows {
		for _, rep := range r.reps {
			rep.warmed()
		}
		for _, cl := range r.fleet {
			cl.warm0 = [2]int64{cl.retries.Load(), cl.hedges.Load()}
		}
	}
	time.Sleep(d) // the case's length: what is measured is the calls made in it
	cancel()
	for _, w := range waits {
		w()
	}
	took := time.Since(from).Seconds()
	// Lanes as the last client sees them, before its pools are closed.
	lanes := make([]string, len(rows))
	for i, r := range rows {
		lanes[i] = r.fleet[len(r.fleet)-1].lanes(r.key)
	}
	// Close the clients' idle connections, then the balancers (which
	// close what is left), then the servers (which wait for their
	// handlers), so that the case's goleak check, which runs before the
	// test's cleanups, sees nothing of them.
	for _, r := range rows {
		for _, cl := range r.fleet {
			cl.close()
		}
	}
	for _, r := range rows {
		if r.proxy != nil {
			r.proxy.close()
		}
		for _, rep := range r.reps {
			rep.srv.Close()
		}
	}

	tb := &figureTable{name: 24, cell: 9, cols: []string{path + " " + proto + ", " + d.String(), "calls/s", "success", "p50", "p99", "degraded", "wire/call", "conns", "retries", "hedges", "opens", "ejections", "lanes"}}
	for i, r := range rows {
		res := r.load.result(r.reps, r.fleet)
		refKey := path + "/" + proto + "/" + replRows[i]
		if c.name == "1-none-degraded" {
			ref[refKey] = res.p99
		}
		if replRows[i] == "resilix+Replicas" && c.check != nil {
			p, ok := ref[refKey]
			c.check(tb, res, p, ok)
		}
		retries, hedges, opens, ejections := "-", "-", "-", "-"
		if r.fleet[0].tr != nil {
			retries, hedges = fmt.Sprint(res.retries), fmt.Sprint(res.hedges)
			opens, ejections = fmt.Sprint(res.opens()), fmt.Sprint(res.ejections)
		}
		tb.row(replRows[i], fmt.Sprintf("%.0f", float64(res.calls)/took), pct(res.oks, res.calls),
			replMS(res.p50), replMS(res.p99), fmt.Sprintf("%.2f%%", 100*res.degShare()),
			fmt.Sprintf("%.3f", res.wirePerCall()), fmt.Sprint(res.conns), retries, hedges, opens, ejections, lanes[i])
	}
	tb.log(t, fmt.Sprintf("case %s: %s, %s; %d replicas (the first degraded), %d clients × %d callers, %d calls/s a row",
		c.name, path, proto, replReplicas, replClients, replCallers, replCallsPerSec))
}

// replReplica is a server on 127.0.0.1 that answers after delay, 503 with
// probability failP (a seeded draw), and counts the connections it
// accepted, the requests it received (wire) and the ones it answered
// before their context ended; warm0 is the three at the warm-up's end.
type replReplica struct {
	srv                   *httptest.Server
	delay                 time.Duration
	failP                 float64
	conns, wire, answered atomic.Int64
	warm0                 [3]int64 // conns, wire, answered, set by warmed

	mu  sync.Mutex
	rng *rand.Rand
}

func newReplReplica(t *testing.T, delay time.Duration, failP float64, seed uint64) *replReplica {
	r := &replReplica{delay: delay, failP: failP, rng: rand.New(rand.NewPCG(seed, 0))}
	r.srv = httptest.NewUnstartedServer(r)
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the balancer's closes are not news
	r.srv.Config.Protocols = new(http.Protocols)
	r.srv.Config.Protocols.SetHTTP1(true)
	r.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	r.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.conns.Add(1)
		}
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *replReplica) addr() string { return r.srv.Listener.Addr().String() }

// warmed marks the end of the warm-up: what counted so far is left out.
func (r *replReplica) warmed() {
	r.warm0 = [3]int64{r.conns.Load(), r.wire.Load(), r.answered.Load()}
}

// counts returns the connections, requests and answers since the warm-up.
func (r *replReplica) counts() (conns, wire, answered int64) {
	return r.conns.Load() - r.warm0[0], r.wire.Load() - r.warm0[1], r.answered.Load() - r.warm0[2]
}

func (r *replReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.wire.Add(1)
	fail := false
	if r.failP > 0 {
		r.mu.Lock()
		fail = r.rng.Float64() < r.failP
		r.mu.Unlock()
	}
	timer := time.NewTimer(r.delay)
	defer timer.Stop()
	select {
	case <-req.Context().Done(): // a hedge's loser, or a call's end
		return
	case <-timer.C:
	}
	r.answered.Add(1)
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// replBalancer is an L4 balancer on 127.0.0.1, as kube-proxy is: each
// connection it accepts goes to a replica drawn uniformly at random
// (seeded), spliced both ways with io.Copy; when either direction ends,
// both connections are closed.
type replBalancer struct {
	l     net.Listener
	addrs []string
	rng   *rand.Rand // under mu
	mu    sync.Mutex
	conns map[net.Conn]struct{} // under mu
	wg    sync.WaitGroup
}

func newReplBalancer(t *testing.T, addrs []string, seed uint64) *replBalancer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &replBalancer{l: l, addrs: addrs, rng: rand.New(rand.NewPCG(seed, 0)), conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.accept)
	t.Cleanup(b.close)
	return b
}

func (b *replBalancer) addr() string { return b.l.Addr().String() }

func (b *replBalancer) accept() {
	for {
		c, err := b.l.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		to := b.addrs[b.rng.IntN(len(b.addrs))]
		b.mu.Unlock()
		s, err := net.DialTimeout("tcp", to, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !b.track(c, s) {
			return // closed meanwhile; track closed both
		}
		var once sync.Once
		end := func() {
			once.Do(func() {
				c.Close()
				s.Close()
				b.mu.Lock()
				delete(b.conns, c)
				delete(b.conns, s)
				b.mu.Unlock()
			})
		}
		b.wg.Go(func() { _, _ = io.Copy(s, c); end() })
		b.wg.Go(func() { _, _ = io.Copy(c, s); end() })
	}
}

// track records a spliced pair, or closes both and reports false once the
// balancer is closed.
func (b *replBalancer) track(c, s net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		c.Close()
		s.Close()
		return false
	}
	b.conns[c], b.conns[s] = struct{}{}, struct{}{}
	return true
}

// close stops accepting, closes every spliced connection and waits for the
// copies. Safe to call more than once.
func (b *replBalancer) close() {
	b.l.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// replHAProxy is HAProxy in TCP mode on 127.0.0.1 in front of the
// replicas, placing each connection on one at random (its own draw, not
// seeded). The process is started by the test and killed by close.
type replHAProxy struct {
	addr string
	cmd  *exec.Cmd
	once sync.Once
}

func newReplHAProxy(t *testing.T, addrs []string) *replHAProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &replHAProxy{addr: l.Addr().String()}
	l.Close() // for HAProxy to bind; another bind in between fails the start below
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n")
	fmt.Fprintf(&cfg, "frontend fe\n  bind %s\n  default_backend be\nbackend be\n  balance random\n", h.addr)
	for i, a := range addrs {
		fmt.Fprintf(&cfg, "  server r%d %s\n", i, a)
	}
	file := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(file, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command("haproxy", "-db", "-f", file)
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	// Wait for the frontend to accept, at most 5s.
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", h.addr, time.Second)
		if err == nil {
			c.Close()
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy did not listen on %s within 5s: %v", h.addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// close kills the process and waits for it, which closes every connection
// it holds. Safe to call more than once.
func (h *replHAProxy) close() {
	h.once.Do(func() {
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
	})
}

// replClient is one process of a fleet: a base *http.Transport of its own
// and, for the resilix rows, a Transport of its own over it, whose
// Observer counts the key's breaker openings and lane ejections, and the
// retries and hedges sent.
type replClient struct {
	base *http.Transport
	tr   *transport.Transport // nil for bare net/http
	c    *http.Client

	opens, ejections atomic.Int64 // of the key: breaker openings, lane ejections
	retries, hedges  atomic.Int64 // wire attempts by kind
	warm0            [2]int64     // retries and hedges at the warm-up's end
}

// newReplClient builds a client: net/http's pool from cleanhttp (resilix's
// default Base) with room for every caller's connection, speaking only
// HTTP/1.1 or only h2c; under set when set is not nil.
func newReplClient(t *testing.T, proto, key string, set *policy.Set) *replClient {
	c := &replClient{base: cleanhttp.DefaultPooledTransport()}
	c.base.MaxIdleConnsPerHost = replCallers
	c.base.Protocols = new(http.Protocols)
	switch proto {
	case "h1":
		c.base.Protocols.SetHTTP1(true)
	case "h2c":
		c.base.Protocols.SetUnencryptedHTTP2(true)
	}
	t.Cleanup(c.base.CloseIdleConnections)
	var rt http.RoundTripper = c.base
	if set != nil {
		tr, err := transport.New(transport.Config{
			Base:     c.base,
			PerKey:   map[string]policy.Set{key: *set},
			Policies: replSet(),
			Observer: &policy.Observer{
				BreakerTransition: func(b policy.BreakerTransition) {
					if b.To == policy.BreakerOpen && b.Key == key {
						c.opens.Add(1)
					}
				},
				AttemptDone: func(a policy.AttemptInfo) {
					switch a.Kind {
					case policy.AttemptRetry:
						c.retries.Add(1)
					case policy.AttemptHedge:
						c.hedges.Add(1)
					}
				},
				LaneEjected: func(e policy.LaneEjection) {
					if e.Key == key {
						c.ejections.Add(1)
					}
				},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.CloseIdleConnections)
		c.tr, rt = tr, tr
	}
	c.c = &http.Client{Transport: rt}
	return c
}

// lanes is what the key's snapshot says of its lanes: "n/ejected", "off"
// without Replicas, "-" for bare net/http.
func (c *replClient) lanes(key string) string {
	if c.tr == nil {
		return "-"
	}
	m := c.tr.Measured(key)
	if !m.HasReplicas {
		return "off"
	}
	return fmt.Sprintf("%d/%d", m.Lanes, m.LanesEjected)
}

func (c *replClient) close() {
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	c.base.CloseIdleConnections()
}

// replLoad is the callers' side of one row: calls made, calls that got a
// 200, and every call's latency, of the calls started from from on.
type replLoad struct {
	from       time.Time // the warm-up's end, set before run
	calls, oks atomic.Int64
	mu         sync.Mutex
	lat        []time.Duration // under mu
}

// run starts callers that each call url every callers/rate seconds until
// ctx is done, and returns a func that waits for them.
func (l *replLoad) run(ctx context.Context, c *replClient, url string, callers int, rate float64) (wait func()) {
	period := time.Duration(float64(time.Second) * float64(callers) / rate)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			var lat []time.Duration
			defer func() {
				l.mu.Lock()
				l.lat = append(l.lat, lat...)
				l.mu.Unlock()
			}()
			next := time.Now().Add(period * time.Duration(w) / time.Duration(callers))
			timer := time.NewTimer(0)
			defer timer.Stop()
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					timer.Reset(d)
					select {
					case <-ctx.Done():
						return
					case <-timer.C:
					}
				}
				if took, counted := l.call(c, url); counted {
					lat = append(lat, took)
				}
				next = next.Add(period)
				if now := time.Now(); next.Before(now.Add(-period)) {
					next = now // behind: drop the backlog, no burst
				}
			}
		})
	}
	return wg.Wait
}

// call makes one call, and reports its latency and whether it counts:
// whether it started after the warm-up.
func (l *replLoad) call(c *replClient, url string) (took time.Duration, counted bool) {
	start := time.Now()
	counted = !start.Before(l.from)
	if counted {
		l.calls.Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), replCallTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.c.Do(req)
	if err != nil {
		return time.Since(start), counted
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	took = time.Since(start)
	if resp.StatusCode == http.StatusOK && counted {
		l.oks.Add(1)
	}
	return took, counted
}

// replResult is one row's figures.
type replResult struct {
	calls, oks    int64
	p50, p99      time.Duration // of every call, failed ones too
	wire          int64         // requests the replicas received
	conns         int64         // connections the replicas accepted
	answered, deg int64         // answers the replicas gave, and the degraded one's
	opensPer      []int64       // breaker openings of the key, per client, warm-up included
	ejections     int64         // lane ejections of the key, the fleet's, warm-up included
	retries       int64         // retries sent, the fleet's
	hedges        int64         // hedges sent, the fleet's
}

func (l *replLoad) result(reps []*replReplica, fleet []*replClient) replResult {
	r := replResult{calls: l.calls.Load(), oks: l.oks.Load()}
	l.mu.Lock()
	lat := slices.Clone(l.lat)
	l.mu.Unlock()
	slices.Sort(lat)
	r.p50, r.p99 = replQuantile(lat, 0.50), replQuantile(lat, 0.99)
	for j, rep := range reps {
		conns, wire, a := rep.counts()
		r.wire += wire
		r.conns += conns
		r.answered += a
		if j == 0 {
			r.deg = a
		}
	}
	for _, c := range fleet {
		r.opensPer = append(r.opensPer, c.opens.Load())
		r.ejections += c.ejections.Load()
		r.retries += c.retries.Load() - c.warm0[0]
		r.hedges += c.hedges.Load() - c.warm0[1]
	}
	return r
}

func (r replResult) success() float64     { return ratio(r.oks, r.calls) }
func (r replResult) wirePerCall() float64 { return ratio(r.wire, r.calls) }
func (r replResult) degShare() float64    { return ratio(r.deg, r.answered) }

func (r replResult) opens() int64 {
	var n int64
	for _, o := range r.opensPer {
		n += o
	}
	return n
}

// replQuantile is the q-quantile of sorted (nearest rank), 0 when empty.
func replQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func replMS(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

func replCountNonZero(ns []int64) int {
	k := 0
	for _, n := range ns {
		if n != 0 {
			k++
		}
	}
	return k
}
