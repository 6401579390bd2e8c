package transport_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestFleetPushback measures whether one replica's pushback benches the
// calls of a fleet's clients: four replicas behind admission.Handler (its
// default Limiter), each with a fixed number of workers behind it (4, 4,
// 2, and 4 that drop to 2 for 2 s of every 6 s), service times lognormal
// with a mean of 10 ms; eight client transports with Replicas over a
// static list of the four, Attempts 2, Retry and Timeout{PerAttempt:
// 250ms}, over HTTP/1.1; calls arriving open loop (Poisson) at 90% of the
// fleet's mean capacity, 2 s deadlines. Each of fbSeeds seeds runs
// fbLength and prints a table: p50 and p99 of the calls, the calls that
// failed (an error, or a status that is not 200), and for each replica the
// time its requests in flight (admission's queue included) were above
// 1.5 × its workers. Targets, in every seed: p99 <= 250 ms, failed calls
// <= 0.5%.
//
// It runs each seed twice: over real loopback, and on an in-memory network
// (httptestutil.Network) in a synctest bubble, where time is virtual and
// the in-memory run measures the fleet's dynamics alone. The replicas'
// workers keep their schedule on both (see fbReplica.work), so that a
// machine slow to wake goroutines does not take capacity from the fleet;
// the notes say how late the machine was (calls started late, answers
// given late), and a machine too busy to keep up makes the loopback run
// measure it. Both are checked against the targets. During the fourth
// replica's dip the fleet's workers serve 1200 calls a second, the load
// offered: the fleet has no spare capacity then. It runs only when
// RESILIX_FLEET_PUSHBACK is set, to 1 or a Go duration replacing fbLength
// (`make fleet-pushback` sets it). RESILIX_FLEET_PUSHBACK_TRACE=1 adds
// notes on how the calls failed, when, on which replica, the lanes the
// clients ejected, each replica's latency and admission limit over time;
// RESILIX_FLEET_PUSHBACK_STRETCH multiplies the service times and
// RESILIX_FLEET_PUSHBACK_EJECT=off turns the clients' ejections off, for
// experiments. Each seed in each mode is a subtest: -run
// 'TestFleetPushback/in-memory/seed-5' -count=50 runs one seed, in memory,
// 50 times.
func TestFleetPushback(t *testing.T) {
	d := optIn(t, "RESILIX_FLEET_PUSHBACK", fbLength, "a measurement of a fleet whose replicas push back; set RESILIX_FLEET_PUSHBACK=1 (or a duration for each seed) to run it, as make fleet-pushback does")
	fbTraceOn = os.Getenv("RESILIX_FLEET_PUSHBACK_TRACE") != ""
	for _, mode := range []string{"in-memory", "loopback"} {
		for seed := uint64(1); seed <= fbSeeds; seed++ {
			t.Run(fmt.Sprintf("%s/seed-%d", mode, seed), func(t *testing.T) {
				if mode == "loopback" {
					defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
					fbRun(t, &fbLoopback{}, seed, d)
					return
				}
				synctest.Test(t, func(t *testing.T) { fbRun(t, &fbMemory{}, seed, d) })
			})
		}
	}
}

// fbNet is where the replicas serve and the clients dial.
type fbNet interface {
	// serve serves h at a new address, and returns it.
	serve(t *testing.T, h http.Handler) string
	// base returns a client's own base transport.
	base() *http.Transport
	// close closes the servers, once the clients' connections are.
	close()
	name() string
}

// fbLoopback serves each replica on 127.0.0.1.
type fbLoopback struct{ srvs []*httptest.Server }

func (l *fbLoopback) serve(t *testing.T, h http.Handler) string {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	l.srvs = append(l.srvs, srv)
	return srv.Listener.Addr().String()
}

func (l *fbLoopback) base() *http.Transport {
	b := cleanhttp.DefaultPooledTransport()
	b.MaxIdleConnsPerHost = 64
	return b
}

func (l *fbLoopback) close() {
	for _, s := range l.srvs {
		s.Close()
	}
}

func (l *fbLoopback) name() string { return "loopback" }

// fbMemory serves each replica on an in-memory network, for a synctest
// bubble.
type fbMemory struct {
	n     httptestutil.Network
	addrs int
}

func (m *fbMemory) serve(_ *testing.T, h http.Handler) string {
	m.addrs++
	addr := fmt.Sprintf("replica%d:80", m.addrs)
	m.n.Listen(addr, h)
	return addr
}

func (m *fbMemory) base() *http.Transport { return m.n.Transport() }
func (m *fbMemory) close()                { m.n.Close() }
func (m *fbMemory) name() string          { return "in memory, virtual time" }

const (
	fbSeeds     = 5
	fbLength    = 12 * time.Second
	fbClients   = 8
	fbService   = 10 * time.Millisecond // the mean service time
	fbSigma     = 0.5                   // of the service time's logarithm
	fbLoad      = 0.9                   // of the fleet's mean capacity
	fbDeadline  = 2 * time.Second
	fbSample    = 5 * time.Millisecond // how often a replica's in-flight count is read
	fbP99Target = 250 * time.Millisecond
	fbFailed    = 0.005
	// The fourth replica's workers drop from 4 to 2 for fbDip of every
	// fbPeriod, from fbPeriod - fbDip into each period.
	fbPeriod = 6 * time.Second
	fbDip    = 2 * time.Second
)

// fbWorkers are the replicas' workers; the last one dips (see fbDip).
var fbWorkers = []int{4, 4, 2, 4}

// fbCapacity is the fleet's mean capacity in calls a second: each
// replica's workers over the mean service time, the dipping one's
// averaged over its period.
func fbCapacity() float64 {
	per := float64(time.Second) / float64(fbService)
	c := 0.0
	for i, w := range fbWorkers {
		wf := float64(w)
		if i == len(fbWorkers)-1 {
			wf = (wf*float64(fbPeriod-fbDip) + float64(w/2)*float64(fbDip)) / float64(fbPeriod)
		}
		c += wf * per
	}
	return c
}

func fbRun(t *testing.T, net fbNet, seed uint64, d time.Duration) {
	start := time.Now()
	reps := make([]*fbReplica, len(fbWorkers))
	addrs := make([]string, len(reps))
	for i, w := range fbWorkers {
		dips := i == len(fbWorkers)-1
		reps[i] = newFBReplica(t, w, dips, start, rand.New(rand.NewPCG(seed, uint64(i+1))))
		addrs[i] = net.serve(t, reps[i])
	}
	url := "http://" + addrs[0] + "/"
	var clients []*http.Client
	var trs []*transport.Transport
	var tr0 *fbTrace
	if fbTraceOn {
		tr0 = newFBTrace(start, addrs)
	}
	for range fbClients {
		tr, err := transport.New(transport.Config{Base: net.base(), Observer: tr0.observer(), Policies: policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{},
			Timeout:  &policy.Timeout{PerAttempt: 250 * time.Millisecond},
			Replicas: &policy.Replicas{Endpoints: transport.Static(addrs...), MaxEjected: fbMaxEjected},
		}})
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
		clients = append(clients, &http.Client{Transport: tr})
	}

	ctx, cancel := context.WithCancel(t.Context())
	var samplers sync.WaitGroup
	for _, r := range reps {
		samplers.Go(func() { r.sample(ctx, start) })
	}
	samplers.Go(func() { tr0.sample(ctx) })
	rate := fbLoad * fbCapacity()
	rng := rand.New(rand.NewPCG(seed, 0))
	var (
		calls   sync.WaitGroup
		mu      sync.Mutex
		lat     []time.Duration
		failed  int
		retries atomic.Int64
		behind  []time.Duration // how late each call started
	)
	next := start
	for i := 0; ; i++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if next.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(next))
		behind = append(behind, time.Since(next))
		cl := clients[i%len(clients)]
		calls.Go(func() {
			rep := &transport.Report{}
			cctx, ccancel := context.WithTimeout(transport.WithReport(ctx, rep), fbDeadline)
			defer ccancel()
			began := time.Now()
			status, err := fbCall(cctx, cl, url)
			took := time.Since(began)
			ok := err == nil && status == http.StatusOK
			retries.Add(int64(rep.Retries))
			tr0.call(began, ok, status, err, rep)
			mu.Lock()
			lat = append(lat, took)
			if !ok {
				failed++
			}
			mu.Unlock()
		})
	}
	calls.Wait()
	cancel()
	samplers.Wait()
	for _, tr := range trs {
		tr.CloseIdleConnections()
	}
	net.close()

	slices.Sort(lat)
	p50, p99 := fbQuantile(lat, 0.5), fbQuantile(lat, 0.99)
	n := int64(len(lat))
	tb := &figureTable{name: 16, cell: 11, cols: []string{fmt.Sprintf("seed %d, %v", seed, d), "calls", "p50", "p99", "failed", "retries"}}
	for i := range reps {
		tb.cols = append(tb.cols, fmt.Sprintf("r%d>1.5x", i+1))
	}
	cells := []string{"resilix+Replicas", fmt.Sprint(n), replMS(p50), replMS(p99), fmt.Sprintf("%d (%s)", failed, pct(int64(failed), n)), fmt.Sprint(retries.Load())}
	for _, r := range reps {
		cells = append(cells, fmt.Sprintf("%.1fs", r.over.Seconds()))
	}
	tb.row(cells...)
	var shed, late []string
	for i, r := range reps {
		shed = append(shed, fmt.Sprintf("r%d %d", i+1, r.refused.Load()))
		late = append(late, fmt.Sprintf("r%d %.2fms", i+1, float64(r.late.Load())/float64(max(r.served.Load(), 1))/1e6))
	}
	slices.Sort(behind)
	tb.note(fmt.Sprintf("refusals answered by admission: %v", shed))
	tb.note(fmt.Sprintf("the machine's lag (none in virtual time): calls started late by %s at the median, %s at p99; served requests answered late by, on average, %v",
		replMS(fbQuantile(behind, 0.5)), replMS(fbQuantile(behind, 0.99)), late))
	tr0.notes(tb, reps)
	tb.check(p99 <= fbP99Target, "seed %d: p99 %v, target <= %v", seed, replMS(p99), replMS(fbP99Target))
	tb.check(float64(failed) <= fbFailed*float64(n), "seed %d: %d of %d calls failed (%s), target <= %.1f%%", seed, failed, n, pct(int64(failed), n), 100*fbFailed)
	tb.log(t, fmt.Sprintf("fleet pushback, %s, seed %d: replicas with %v workers (the last drops to %d for %v of every %v), lognormal service of mean %v, %d clients, %.0f calls/s (%.0f%% of %.0f)",
		net.name(), seed, fbWorkers, fbWorkers[len(fbWorkers)-1]/2, fbDip, fbPeriod, fbService, fbClients, rate, 100*fbLoad, fbCapacity()))
}

// fbCall makes one GET and returns its status, once its body is read, or
// the error that ended it.
func fbCall(ctx context.Context, cl *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// fbQuantile returns the q-quantile of sorted (nearest rank).
func fbQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// fbReplica is a replica: admission.Handler, with its defaults, in front
// of a fixed number of workers (a FIFO queue before them), each request
// holding one for a lognormal service time.
type fbReplica struct {
	h        http.Handler
	workers  int
	dips     bool
	start    time.Time
	inFlight atomic.Int64 // requests in the server, admission's queue included
	refused  atomic.Int64 // answered 503 or 429 by admission
	served   atomic.Int64 // requests that held a worker for their whole service time
	late     atomic.Int64 // ns: how much later than scheduled they were answered
	over     time.Duration
	trace    *fbLimitTrace // with fbTraceOn

	mu    sync.Mutex
	rng   *rand.Rand
	busy  int
	limit int
	wait  []chan time.Time // each is given the time its worker came free
}

func newFBReplica(t *testing.T, workers int, dips bool, start time.Time, rng *rand.Rand) *fbReplica {
	r := &fbReplica{workers: workers, dips: dips, start: start, rng: rng, limit: workers}
	cfg := admission.Config{Name: "replica"}
	if fbTraceOn {
		r.trace = &fbLimitTrace{codes: map[int]int{}}
		cfg.Observer = &policy.Observer{Attach: func(s policy.StateSource) { r.trace.src = s }}
	}
	h, err := admission.Handler(http.HandlerFunc(r.work), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	return r
}

func (r *fbReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	r.h.ServeHTTP(&refusals{ResponseWriter: w, n: &r.refused, r: r}, req)
}

// workersAt returns the replica's workers at now.
func (r *fbReplica) workersAt(now time.Time) int {
	if r.dips && now.Sub(r.start)%fbPeriod >= fbPeriod-fbDip {
		return r.workers / 2
	}
	return r.workers
}

// work holds a worker for a service time, waiting its turn for one.
//
// A worker keeps its schedule: a request it takes from the queue starts
// when the worker came free (the end its last request was scheduled for),
// not when the machine wakes the request's goroutine, and its service ends
// at its start plus its service time, however late its timer fires. So a
// machine slow to wake goroutines delays answers (late counts by how
// much) but takes no capacity from the replica, as a server whose own CPU
// is not the one the harness shares would not lose it; the in-memory run,
// whose timers fire on time, is the same either way.
func (r *fbReplica) work(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	r.mu.Lock()
	r.setLimitLocked(r.workersAt(arrived), arrived)
	service := time.Duration(fbStretch * float64(fbService) * math.Exp(fbSigma*r.rng.NormFloat64()-fbSigma*fbSigma/2))
	start := arrived
	var turn chan time.Time
	if r.busy < r.limit {
		r.busy++
	} else {
		turn = make(chan time.Time, 1)
		r.wait = append(r.wait, turn)
	}
	r.mu.Unlock()
	if turn != nil {
		select {
		case free := <-turn:
			start = later(free, arrived)
		case <-req.Context().Done():
			r.mu.Lock()
			if i := slices.Index(r.wait, turn); i >= 0 {
				r.wait = slices.Delete(r.wait, i, i+1)
				r.mu.Unlock()
				return
			}
			r.mu.Unlock()
			r.release(<-turn) // granted as it gave up: free since then
			return
		}
	}
	end := start.Add(service)
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	select {
	case <-timer.C:
		r.served.Add(1)
		r.late.Add(int64(time.Since(end)))
		io.WriteString(w, "ok")
		r.release(end)
	case <-req.Context().Done():
		r.release(time.Now())
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// release frees a worker, free since at.
func (r *fbReplica) release(at time.Time) {
	r.mu.Lock()
	r.busy--
	r.grantLocked(at)
	r.mu.Unlock()
}

// setLimitLocked sets the workers to n at now; r.mu is held.
func (r *fbReplica) setLimitLocked(n int, now time.Time) {
	if n != r.limit {
		r.limit = n
		r.grantLocked(now)
	}
}

// grantLocked hands free workers, free since at, to the requests waiting,
// in order.
func (r *fbReplica) grantLocked(at time.Time) {
	for r.busy < r.limit && len(r.wait) > 0 {
		r.wait[0] <- at
		r.wait = r.wait[1:]
		r.busy++
	}
}

// sample adds up, every fbSample until ctx ends, the time the requests in
// the server were above 1.5 × its workers at the time; it also moves the
// workers to the time's count when no request does.
func (r *fbReplica) sample(ctx context.Context, start time.Time) {
	tick := time.NewTicker(fbSample)
	defer tick.Stop()
	last := start
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			w := r.workersAt(now)
			r.mu.Lock()
			r.setLimitLocked(w, now)
			r.mu.Unlock()
			r.traceSample(now)
			if float64(r.inFlight.Load()) > 1.5*float64(w) {
				r.over += now.Sub(last)
			}
			last = now
		}
	}
}

// refusals counts in n the refusals admission answers (503 and 429).
type refusals struct {
	http.ResponseWriter
	n *atomic.Int64
	r *fbReplica // to trace them, or nil
}

func (s *refusals) WriteHeader(code int) {
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		s.n.Add(1)
	}
	if s.r != nil && code != http.StatusOK {
		s.r.traceRefusal(code, s.Header())
	}
	s.ResponseWriter.WriteHeader(code)
}
