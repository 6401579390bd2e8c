package transport_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestFlaky measures how resilix's default chain treats a flaky host, over
// real loopback sockets, beside bare net/http as the reference, and checks
// the figures against targets. It runs only when RESILIX_FLAKY is set: to
// 1, or to a Go duration that replaces the 8s of the steady scenarios
// (`make flaky` sets it). It prints one table per scenario.
//
// In every scenario each client (resilix, net/http) has its own server on
// 127.0.0.1 with the same faults, and the two run side by side, at the same
// time, so that a scenario takes its length once; they share the machine's
// two cores, not a server, a breaker or a fault draw. Callers are paced (a
// fixed period per caller, no catching up on a backlog), so that a client
// that refuses at once does not spin, and each call has a 5s deadline.
// Figures are counts and ratios; the only times measured are the ones the
// targets are about (time to the first success, time to the breaker's
// opening), in seconds against targets of seconds.
func TestFlaky(t *testing.T) {
	steady := optIn(t, "RESILIX_FLAKY", 8*time.Second, "a loopback measurement of a flaky host; set RESILIX_FLAKY=1 (or a duration for the steady scenarios) to run it, as make flaky does")
	t.Run("steady", func(t *testing.T) { flakySteadyScenario(t, steady) })
	t.Run("fresh-resets", func(t *testing.T) { flakyFreshResets(t, steady) })
	t.Run("outage", flakyOutage)
	t.Run("jump", flakyJump)
}

// optIn reads the environment variable of an opt-in loopback measurement:
// unset skips with why (what, and how to run it), 1 is def, a duration is
// itself.
func optIn(t *testing.T, env string, def time.Duration, why string) time.Duration {
	v := os.Getenv(env)
	if v == "" {
		t.Skip(why)
	}
	if v == "1" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want 1 or a positive duration", env, v)
	}
	return d
}

const (
	flakyCallers     = 16
	flakyCallTimeout = 5 * time.Second
)

// flakyDefault is the chain a user writes: retry, breaker and a per-attempt
// timeout, every other field at its default (Attempts 3, the default
// Budget).
func flakyDefault() policy.Set {
	return policy.Set{
		Retry:   &policy.Retry{},
		Breaker: &policy.Breaker{},
		Timeout: &policy.Timeout{PerAttempt: 1 * time.Second},
	}
}

// flakyClient is one row of a table: resilix over a counted base, or the
// counted base alone.
type flakyClient struct {
	name string
	tr   *transport.Transport // nil for bare net/http
	base *http.Transport
	c    *http.Client

	sent            atomic.Int64 // round trips that reached base
	retries, hedges atomic.Int64 // wire attempts by kind, from AttemptDone
	opens           atomic.Int64 // breaker transitions to open
	skipMu          sync.Mutex
	skipped         map[string]int // retries not sent, by reason
	firstOpen       atomic.Int64   // unix ns of the first opening after openMark
	openMark        atomic.Int64   // unix ns; 0 until set
}

// flakyClients returns resilix with set, and bare net/http; each over a
// base of its own from cleanhttp.DefaultPooledTransport, with keep-alives
// off when fresh.
func flakyClients(t *testing.T, set policy.Set, fresh bool) []*flakyClient {
	var cs []*flakyClient
	for _, name := range []string{"resilix", "net/http"} {
		c := &flakyClient{name: name, base: cleanhttp.DefaultPooledTransport()}
		c.base.DisableKeepAlives = fresh
		t.Cleanup(c.base.CloseIdleConnections)
		var rt http.RoundTripper = flakyCounted{c.base, &c.sent}
		if name == "resilix" {
			tr, err := transport.New(transport.Config{Base: rt, Policies: set, Observer: c.observer()})
			if err != nil {
				t.Fatal(err)
			}
			c.tr, rt = tr, tr
		}
		c.c = &http.Client{Transport: rt}
		cs = append(cs, c)
	}
	return cs
}

func (c *flakyClient) observer() *policy.Observer {
	return &policy.Observer{
		AttemptDone: func(a policy.AttemptInfo) {
			switch a.Kind {
			case policy.AttemptRetry:
				c.retries.Add(1)
			case policy.AttemptHedge:
				c.hedges.Add(1)
			}
		},
		RetrySkipped: func(r policy.RetrySkip) {
			c.skipMu.Lock()
			if c.skipped == nil {
				c.skipped = map[string]int{}
			}
			c.skipped[r.Reason.String()]++
			c.skipMu.Unlock()
		},
		BreakerTransition: func(b policy.BreakerTransition) {
			if b.To != policy.BreakerOpen {
				return
			}
			c.opens.Add(1)
			now := time.Now().UnixNano()
			if m := c.openMark.Load(); m != 0 && now >= m {
				c.firstOpen.CompareAndSwap(0, now)
			}
		},
	}
}

// skips lists the retries not sent, by reason, as "budget:3 gate:1"; "-"
// for net/http and "0" when none were skipped.
func (c *flakyClient) skips() string {
	if c.tr == nil {
		return "-"
	}
	c.skipMu.Lock()
	defer c.skipMu.Unlock()
	if len(c.skipped) == 0 {
		return "0"
	}
	reasons := make([]string, 0, len(c.skipped))
	for r, n := range c.skipped {
		reasons = append(reasons, fmt.Sprintf("%s:%d", r, n))
	}
	slices.Sort(reasons)
	return strings.Join(reasons, " ")
}

// count is n for resilix, whose Observer counts it, and "-" for net/http.
func (c *flakyClient) count(n *atomic.Int64) string {
	if c.tr == nil {
		return "-"
	}
	return fmt.Sprint(n.Load())
}

// flakyCounted counts the round trips that reach its base.
type flakyCounted struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (f flakyCounted) RoundTrip(r *http.Request) (*http.Response, error) {
	f.n.Add(1)
	return f.rt.RoundTrip(r)
}

// flakyLoad is the callers' side of one client: calls made, calls that got
// a 200, and the first success after a mark.
type flakyLoad struct {
	calls, oks atomic.Int64
	mark       atomic.Int64 // unix ns; 0 until set
	firstOK    atomic.Int64 // unix ns of the first success to end after mark
}

// run starts callers that each call url every callers/rate seconds until
// ctx is done, and returns a func that waits for them.
func (l *flakyLoad) run(ctx context.Context, c *flakyClient, url string, callers int, rate float64) (wait func()) {
	period := time.Duration(float64(time.Second) * float64(callers) / rate)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
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
				l.call(c, url)
				next = next.Add(period)
				if now := time.Now(); next.Before(now.Add(-period)) {
					next = now // behind: drop the backlog, no burst
				}
			}
		})
	}
	return wg.Wait
}

func (l *flakyLoad) call(c *flakyClient, url string) {
	l.calls.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), flakyCallTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.c.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	l.oks.Add(1)
	now := time.Now().UnixNano()
	if m := l.mark.Load(); m != 0 && now >= m {
		l.firstOK.CompareAndSwap(0, now)
	}
}

// flakyServer is an Upstream on 127.0.0.1 that counts the connections it
// accepts.
type flakyServer struct {
	up    *httptestutil.Upstream
	srv   *httptest.Server
	conns atomic.Int64
}

func newFlakyServer(t *testing.T, seed uint64, faults ...httptestutil.Fault) *flakyServer {
	s := &flakyServer{up: httptestutil.NewUpstream(httptestutil.Options{Seed: seed, Faults: faults})}
	s.srv = httptest.NewUnstartedServer(s.up)
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // resets are the point
	s.srv.Listener = flakyListener{s.srv.Listener, &s.conns}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

type flakyListener struct {
	net.Listener
	n *atomic.Int64
}

func (l flakyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// figureTable is one scenario's figures, logged as a fixed-width table,
// with notes under it and the targets missed.
type figureTable struct {
	// name and cell are the widths of the first column and of the
	// others; zero is 28 and 10.
	name, cell  int
	cols        []string
	rows        [][]string
	miss, notes []string
}

func (tb *figureTable) row(cells ...string) { tb.rows = append(tb.rows, cells) }

// check records a missed target: what was measured against what was asked.
func (tb *figureTable) check(ok bool, format string, args ...any) {
	if !ok {
		tb.miss = append(tb.miss, fmt.Sprintf(format, args...))
	}
}

func (tb *figureTable) note(s string) { tb.notes = append(tb.notes, s) }

func (tb *figureTable) log(t *testing.T, title string) {
	t.Helper()
	name, cell := cmp.Or(tb.name, 28), cmp.Or(tb.cell, 10)
	line := func(cells []string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%-*s", name, cells[0])
		for _, c := range cells[1:] {
			fmt.Fprintf(&b, " %*s", cell, c)
		}
		return b.String()
	}
	out := []string{title, line(tb.cols)}
	for _, r := range tb.rows {
		out = append(out, line(r))
	}
	out = append(out, tb.notes...)
	t.Logf("\n%s", strings.Join(out, "\n"))
	for _, m := range tb.miss {
		t.Error(m)
	}
}

func pct(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}

func ratio(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// flakyKey is the default Key of a server's URL.
func flakyKey(url string) string { return strings.TrimPrefix(url, "http://") }

// flakyEnd stops the callers and waits for them, closes the clients' idle
// connections, and closes the servers (which waits for their handlers), so
// that the scenario's goleak check, which runs before the test's cleanups,
// sees nothing of them.
func flakyEnd(cancel context.CancelFunc, waits []func(), cs []*flakyClient, closers ...func()) {
	cancel()
	for _, w := range waits {
		w()
	}
	for _, c := range cs {
		c.base.CloseIdleConnections()
	}
	for _, c := range closers {
		c()
	}
}

// Scenario 1: 16 callers at 2000 calls/s in all for steady (8s), GETs,
// pooled connections; the server answers 503 to a seeded 20% of requests,
// or (resets) hijacks the connection of 20% of requests and closes it
// with SO_LINGER 0, a TCP RST before any answer. net/http retries a GET
// whose reused connection was reset on its own, below resilix; the wire
// figure is the server's count of requests, so it includes those.
func flakySteadyScenario(t *testing.T, d time.Duration) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const rate = 2000
	tb := &figureTable{cols: []string{"20% failing, " + d.String(), "calls/s", "success", "wire/call", "conns/call", "retries", "opens", "err rate", "trip"}}
	for _, v := range []struct {
		name  string
		fault httptestutil.Fault
	}{
		{"503", httptestutil.Fault{Probability: 0.2, Status: 503}},
		{"reset", httptestutil.Fault{Probability: 0.2, Reset: true}},
	} {
		cs := flakyClients(t, flakyDefault(), false)
		loads, srvs, took := flakyRun(t, cs, 1, v.fault, rate, d)
		for i, c := range cs {
			l, s := loads[i], srvs[i]
			calls, oks := l.calls.Load(), l.oks.Load()
			wire := s.up.Stats().Requests
			errRate, trip, opens := "-", "-", "-"
			if c.tr != nil {
				m := c.tr.Measured(flakyKey(s.srv.URL))
				errRate, trip, opens = fmt.Sprintf("%.3f", m.ErrorRate), fmt.Sprintf("%.3f", m.TripPoint), fmt.Sprint(c.opens.Load())
				tb.check(c.opens.Load() == 0, "steady %s: the breaker opened %d times, target 0", v.name, c.opens.Load())
				tb.check(ratio(oks, calls) >= 0.97, "steady %s: %s of calls succeeded, target >= 97%%", v.name, pct(oks, calls))
			}
			tb.row(v.name+" "+c.name, fmt.Sprintf("%.0f", float64(calls)/took), pct(oks, calls),
				fmt.Sprintf("%.3f", ratio(wire, calls)), fmt.Sprintf("%.3f", ratio(s.conns.Load(), calls)),
				c.count(&c.retries), opens, errRate, trip)
		}
	}
	tb.log(t, "scenario 1: steady 20% failing, 16 callers, GETs, pooled connections")
}

// Scenario 2: Retry and Hedge on, every request on a connection of its own
// (DisableKeepAlives on the base, so that net/http never retries a reset
// of a reused connection below resilix), 16 callers at 2000 calls/s in
// all, for steady (8s: longer than the default breaker's OpenFor, so that
// an opening is followed by its probes); the server resets 20% of
// connections (all of them in the variant) after reading the request and
// before answering. Wire calls are the server's count of requests; every
// one came on a fresh connection.
// flakyRun runs flakyCallers callers at rate against a server of its own
// with fault for each client of cs, side by side, for d, and returns each
// client's load and server, and the seconds it took.
func flakyRun(t *testing.T, cs []*flakyClient, seed uint64, fault httptestutil.Fault, rate float64, d time.Duration) ([]*flakyLoad, []*flakyServer, float64) {
	ctx, cancel := context.WithCancel(t.Context())
	var waits []func()
	loads := make([]*flakyLoad, len(cs))
	srvs := make([]*flakyServer, len(cs))
	start := time.Now()
	for i, c := range cs {
		srvs[i] = newFlakyServer(t, seed, fault)
		loads[i] = &flakyLoad{}
		waits = append(waits, loads[i].run(ctx, c, srvs[i].srv.URL, flakyCallers, rate))
	}
	time.Sleep(d)
	flakyEnd(cancel, waits, cs, srvs[0].srv.Close, srvs[1].srv.Close)
	return loads, srvs, time.Since(start).Seconds()
}

func flakyFreshResets(t *testing.T, d time.Duration) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const rate = 2000
	set := flakyDefault()
	set.Hedge = &policy.Hedge{}
	tb := &figureTable{cols: []string{"fresh conns, " + d.String(), "calls/s", "success", "wire/call", "conns/call", "retries", "hedges", "extra/call", "opens", "skipped"}}
	for _, v := range []struct {
		name string
		p    float64
	}{{"20% reset", 0.2}, {"all reset", 1}} {
		cs := flakyClients(t, set, true)
		loads, srvs, took := flakyRun(t, cs, 2, httptestutil.Fault{Probability: v.p, Reset: true}, rate, d)
		for i, c := range cs {
			l, s := loads[i], srvs[i]
			calls, oks := l.calls.Load(), l.oks.Load()
			wire := s.up.Stats().Requests
			extra := c.retries.Load() + c.hedges.Load()
			opens := "-"
			if c.tr != nil {
				opens = fmt.Sprint(c.opens.Load())
				if v.p < 1 {
					tb.check(ratio(oks, calls) >= 0.99, "fresh %s: %s of calls succeeded, target >= 99%%", v.name, pct(oks, calls))
					tb.check(ratio(wire, calls) <= 1.35, "fresh %s: %.3f wire calls per call, target <= 1.35", v.name, ratio(wire, calls))
				} else {
					tb.check(ratio(wire, calls) <= 1.25, "fresh %s: %.3f wire calls per call (retries + hedges %.3f per call), target <= 1.25 wire calls per call",
						v.name, ratio(wire, calls), ratio(extra, calls))
				}
			}
			tb.row(v.name+" "+c.name, fmt.Sprintf("%.0f", float64(calls)/took), pct(oks, calls),
				fmt.Sprintf("%.3f", ratio(wire, calls)), fmt.Sprintf("%.3f", ratio(s.conns.Load(), calls)),
				c.count(&c.retries), c.count(&c.hedges), fmt.Sprintf("%.3f", ratio(extra, calls)), opens, c.skips())
		}
	}
	tb.log(t, "scenario 2: resets on fresh connections, Retry + Hedge, 16 callers")
}

// flapServer serves an Upstream on one 127.0.0.1 port that it can take
// down (the listener and every connection closed, so that connecting is
// refused) and bring back on the same port.
type flapServer struct {
	up    *httptestutil.Upstream
	addr  string
	srv   *http.Server
	wg    sync.WaitGroup
	conns atomic.Int64
}

func newFlapServer(t *testing.T) *flapServer {
	f := &flapServer{up: httptestutil.NewUpstream(httptestutil.Options{}), addr: "127.0.0.1:0"}
	if err := f.listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	return f
}

// listen serves on f.addr, retrying for up to 2s while the port is not yet
// free again.
func (f *flapServer) listen() error {
	var ln net.Listener
	var err error
	for end := time.Now().Add(2 * time.Second); ; {
		if ln, err = net.Listen("tcp", f.addr); err == nil || time.Now().After(end) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("listen again on %s: %w", f.addr, err)
	}
	f.addr = ln.Addr().String()
	srv := &http.Server{Handler: f.up, ErrorLog: log.New(io.Discard, "", 0)}
	f.srv = srv
	f.wg.Go(func() { _ = srv.Serve(flakyListener{ln, &f.conns}) })
	return nil
}

func (f *flapServer) down() { f.srv.Close() }

func (f *flapServer) close() {
	f.srv.Close()
	f.wg.Wait()
}

// Scenario 3: 16 callers at 400 calls/s in all; the server answers for 2s,
// then for 8s either refuses connections (its listener closed, and every
// connection with it) or answers 503 to everything, then is back (on the
// same port) for up to 8s, until both clients have had a success. Figures:
// from the moment it is back to each client's first success to end after
// it, and the wire calls per second that reached each client's base
// (counted at the base: a refused connection is never accepted, so the
// listener cannot count it) from the outage's first second to its end.
func flakyOutage(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const (
		rate   = 400
		warm   = 2 * time.Second
		outage = 8 * time.Second
		after  = 8 * time.Second
	)
	tb := &figureTable{cols: []string{"8s outage", "success", "first ok", "wire/s", "calls", "opens"}}
	for _, variant := range []string{"refused", "503"} {
		cs := flakyClients(t, flakyDefault(), false)
		ctx, cancel := context.WithCancel(t.Context())
		var waits []func()
		loads := make([]*flakyLoad, len(cs))
		srvs := make([]*flapServer, len(cs))
		for i, c := range cs {
			srvs[i] = newFlapServer(t)
			loads[i] = &flakyLoad{}
			waits = append(waits, loads[i].run(ctx, c, "http://"+srvs[i].addr+"/", flakyCallers, rate))
		}
		time.Sleep(warm)
		for _, s := range srvs {
			if variant == "refused" {
				s.down()
			} else {
				s.up.SetFaults(httptestutil.Fault{Probability: 1, Status: 503})
			}
		}
		downAt := time.Now()
		time.Sleep(time.Second)
		sentA := make([]int64, len(cs))
		for i, c := range cs {
			sentA[i] = c.sent.Load()
		}
		aAt := time.Now()
		time.Sleep(outage - time.Since(downAt))
		sentB := make([]int64, len(cs))
		for i, c := range cs {
			sentB[i] = c.sent.Load()
		}
		window := time.Since(aAt).Seconds()
		for _, s := range srvs {
			if variant == "refused" {
				if err := s.listen(); err != nil {
					t.Fatal(err)
				}
			} else {
				s.up.SetFaults()
			}
		}
		back := time.Now()
		for _, l := range loads {
			l.mark.Store(back.UnixNano())
		}
		for end := back.Add(after); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if loads[0].firstOK.Load() != 0 && loads[1].firstOK.Load() != 0 {
				break
			}
		}
		flakyEnd(cancel, waits, cs, srvs[0].close, srvs[1].close)
		for i, c := range cs {
			l := loads[i]
			wireRate := float64(sentB[i]-sentA[i]) / window
			first, firstOK := "none", l.firstOK.Load()
			var sinceBack time.Duration
			if firstOK != 0 {
				sinceBack = time.Unix(0, firstOK).Sub(back)
				first = fmt.Sprintf("%.3fs", sinceBack.Seconds())
			}
			opens := "-"
			if c.tr != nil {
				opens = fmt.Sprint(c.opens.Load())
				tb.check(firstOK != 0 && sinceBack <= 1500*time.Millisecond,
					"outage %s: first success %s after the upstream was back, target <= 1.5s", variant, first)
				tb.check(wireRate <= 3, "outage %s: %.1f wire calls/s during the outage after its first second, target <= 3", variant, wireRate)
			}
			tb.row(variant+" "+c.name, pct(l.oks.Load(), l.calls.Load()), first, fmt.Sprintf("%.1f", wireRate), fmt.Sprint(l.calls.Load()), opens)
		}
	}
	tb.log(t, "scenario 3: an 8s outage, then back; 16 callers, 400 calls/s")
}

// Scenario 4: 16 callers at 200 calls/s in all; the server answers 503 to
// a seeded 5% of requests for 16s (two completed slices of the default
// breaker's 30s window, so that it has learned a baseline: the trip point
// it holds at the jump is printed), then to 60% for 4s. Figures: openings
// during the calm, the breaker's error rate and trip point just before the
// jump, and the time from the jump to its first opening.
func flakyJump(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const (
		rate  = 200
		calm  = 16 * time.Second
		storm = 4 * time.Second
	)
	tb := &figureTable{cols: []string{"5% -> 60%", "calm ok", "storm ok", "calm opens", "err rate", "trip", "opened in"}}
	cs := flakyClients(t, flakyDefault(), false)
	ctx, cancel := context.WithCancel(t.Context())
	var waits []func()
	loads := make([]*flakyLoad, len(cs))
	srvs := make([]*flakyServer, len(cs))
	for i, c := range cs {
		srvs[i] = newFlakyServer(t, 4, httptestutil.Fault{Probability: 0.05, Status: 503})
		loads[i] = &flakyLoad{}
		waits = append(waits, loads[i].run(ctx, c, srvs[i].srv.URL, flakyCallers, rate))
	}
	time.Sleep(calm)
	calmCalls, calmOKs, calmOpens := make([]int64, len(cs)), make([]int64, len(cs)), make([]int64, len(cs))
	snaps := make([]policy.Snapshot, len(cs))
	for i, c := range cs {
		if c.tr != nil {
			snaps[i] = c.tr.Measured(flakyKey(srvs[i].srv.URL))
		}
	}
	jump := time.Now()
	for i, c := range cs {
		c.openMark.Store(jump.UnixNano())
		srvs[i].up.SetFaults(httptestutil.Fault{Probability: 0.6, Status: 503})
		calmCalls[i], calmOKs[i], calmOpens[i] = loads[i].calls.Load(), loads[i].oks.Load(), c.opens.Load()
	}
	time.Sleep(storm)
	flakyEnd(cancel, waits, cs, srvs[0].srv.Close, srvs[1].srv.Close)
	for i, c := range cs {
		l := loads[i]
		stormCalls, stormOKs := l.calls.Load()-calmCalls[i], l.oks.Load()-calmOKs[i]
		opens, errRate, trip, in := "-", "-", "-", "-"
		if c.tr != nil {
			opens = fmt.Sprint(calmOpens[i])
			errRate, trip = fmt.Sprintf("%.3f", snaps[i].ErrorRate), fmt.Sprintf("%.3f", snaps[i].TripPoint)
			in = "none"
			var took time.Duration
			if f := c.firstOpen.Load(); f != 0 {
				took = time.Unix(0, f).Sub(jump)
				in = fmt.Sprintf("%.3fs", took.Seconds())
			}
			tb.check(c.firstOpen.Load() != 0 && took <= 2*time.Second,
				"jump: the breaker opened %s after the failure rate went from 5%% to 60%% (in %v), target <= 2s", in, storm)
		}
		tb.row(c.name, pct(calmOKs[i], calmCalls[i]), pct(stormOKs, stormCalls), opens, errRate, trip, in)
	}
	tb.log(t, "scenario 4: failure rate 5% for 16s, then 60%; 16 callers, 200 calls/s; err rate and trip read at the jump")
}
