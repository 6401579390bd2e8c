package transport_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestTied measures tied requests (Hedge.Tied) against hedging at the p95
// and against no hedging, over loopback: four replicas behind
// admission.Handler, each with tiedWorkers workers and the limiter fixed
// at them (InitialLimit = MinLimit = MaxLimit), so that a request leaves
// admission's queue, and is told it started, exactly when a worker takes
// it; the queue (QueueFactor tiedQueueFactor) is deep enough that bursts
// wait rather than be refused. A request holds its worker for a timed
// wait, lognormal with a mean of tiedService, and lets it go when its
// caller goes away. Each configuration has its own tiedClients client
// transports with Replicas over the four addresses (Endpoints), so that
// a call's second leg goes to another replica, Retry and Attempts 2, so
// that a call has at most one hedge, its twin when tied; calls
// arrive open loop, Poisson at a rate that alternates between 1.5× and
// 0.5× of the mean every tiedPhase, the mean at 70% and 85% of the
// fleet's capacity, each call with a tiedDeadline. Over HTTP/1.1 and h2c.
//
// A run gives each configuration a warm-up slice (tiedWarm), then
// tiedSlices slices of the slice length, interleaved (the order shuffled
// each round) so that the machine's noise falls on them alike, each
// configuration's k-th slice with the same arrivals. A call may outlive
// its slice; each request names its configuration in a header
// (tiedConfigHeader), which the servers count it under. Hedging runs
// twice, as two configurations: the spread between the two is the
// machine's noise, and the tail targets are judged only when it is
// within their margin. Two more configurations, hedging and tied against
// a second fleet of plain servers (the same workers behind a FIFO queue
// of their own, no admission, so no start signal), check that a key that
// learns its upstream does not speak ties costs no more wire calls than
// hedging. Clients are new each run, so what they learn is in the
// figures. Before the runs each replica gets one request marked as tied,
// from net/http alone: admission's replicas must tell it that it started,
// through the harness's wrappers, and the plain ones must not.
//
// A table per protocol and load gives, as the median of tiedRuns runs:
// p50, p99 and p99.9 of the calls, failed calls (an error, or a status
// other than 200), wire calls per call (the transports' Report), handler
// executions per call (counted at the servers), requests that left a
// queue because their caller went away (admission answers them 499 to
// nobody; twins cancelled while queued) and refusals. Targets, each on
// the median of the runs (of each run's ratio, for a ratio): tied p99 and
// p99.9 at most tiedTailTarget × hedging's, with hedging's two
// configurations within 1/tiedTailTarget × of each other; tied handler
// executions per call at most tiedExecTarget. Against the plain fleet, over all the runs' calls, warm-ups included:
// tied's extra wire calls per call (those above one) at most
// tiedLearnFactor × hedging's + tiedLearnSlack. Tied's extra wire calls
// over hedging's against admission are reported, not judged.
//
// The service times the machine delivered are in the notes: a machine too
// busy to wake a timer on time stretches them and adds its own tail to
// every configuration alike, which narrows the gaps the targets are about.
// It runs only when RESILIX_TIED is set, to 1 or a Go duration replacing
// tiedSlice (`make tied` sets it).
func TestTied(t *testing.T) {
	slice := optIn(t, "RESILIX_TIED", tiedSlice, "a loopback measurement of tied requests; set RESILIX_TIED=1 (or a duration for each slice) to run it, as make tied does")
	for _, proto := range []string{"h1", "h2c"} {
		for _, load := range tiedLoads {
			t.Run(fmt.Sprintf("%s/load-%.0f%%", proto, 100*load), func(t *testing.T) {
				defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
				tiedScenario(t, proto, load, slice)
			})
		}
	}
}

const (
	tiedReplicas = 4
	tiedWorkers  = 8
	// tiedService is the mean service time: long beside the few
	// milliseconds a busy machine adds to a timer's wait.
	tiedService = 40 * time.Millisecond
	// tiedSigma is of the service time's logarithm: a p99 of 1.7 times
	// the mean, so that the tail is the queue's, which ties act on, more
	// than the service's, which only hedging a started request can cut.
	tiedSigma = 0.25
	// tiedQueueFactor sizes admission's queue at 128 places a replica:
	// a 1.5× phase at 85% leaves about 90 requests queued in the fleet,
	// two dozen a replica, twice that with every call's twin, and a
	// machine that stretches the service times for a while adds its own.
	tiedQueueFactor = 16
	tiedClients     = 2
	tiedDeadline    = 2 * time.Second
	// tiedPhase is how long the arrival rate stays at 1.5× or 0.5× of
	// its mean: several service times, so that a burst builds a queue.
	tiedPhase = 400 * time.Millisecond
	// tiedSlice is two phases of the arrival rate, whose queue the low
	// phase drains: short, so that a stall of the machine falls on
	// several configurations' slices.
	tiedSlice = 800 * time.Millisecond
	// tiedWarm is the slice each configuration gets at the start of a
	// run, left out of the figures but for the wire calls of learning:
	// hedging needs MinSamples answers a client before it hedges.
	tiedWarm = 300 * time.Millisecond
	// tiedSlices is how many slices each configuration gets in a run.
	tiedSlices = 6
	tiedRuns   = 3
	// tiedDrain bounds the wait for a fleet to be idle after its calls.
	tiedDrain = 5 * time.Second

	tiedTailTarget = 0.8
	tiedExecTarget = 1.02
	// tiedLearnFactor and tiedLearnSlack are the hedged share's own
	// noise between two configurations of the same chain: hedges come in
	// bunches when the machine stalls every call in flight.
	tiedLearnFactor = 1.25
	tiedLearnSlack  = 0.01
)

// tiedLoads are the mean arrival rates, as shares of the fleet's capacity.
var tiedLoads = []float64{0.70, 0.85}

// tiedCapacity is the fleet's capacity in calls a second.
func tiedCapacity() float64 {
	return tiedReplicas * tiedWorkers * float64(time.Second) / float64(tiedService)
}

// tiedConfig is one column of the comparison: a client chain against a
// fleet.
type tiedConfig struct {
	name  string
	plain bool          // against the fleet without admission
	hedge *policy.Hedge // nil: no hedging
}

var tiedConfigs = [...]tiedConfig{
	{name: "no hedging"},
	{name: "hedging p95", hedge: &policy.Hedge{}},
	{name: "tied", hedge: &policy.Hedge{Tied: true}},
	{name: "hedging p95, again", hedge: &policy.Hedge{}},
	{name: "hedging p95, plain", plain: true, hedge: &policy.Hedge{}},
	{name: "tied, plain", plain: true, hedge: &policy.Hedge{Tied: true}},
}

// The indexes of tiedConfigs the targets compare. tiedAgain is hedging
// once more, the control: what sets it apart from tiedHedge is the
// machine's noise, which a difference the targets ask for must exceed.
const (
	tiedHedge      = 1
	tiedTied       = 2
	tiedAgain      = 3
	tiedPlainHedge = 4
	tiedPlainTied  = 5
)

// tiedScenario runs tiedRuns runs of every configuration at one protocol
// and load, and logs and checks their table.
func tiedScenario(t *testing.T, proto string, load float64, slice time.Duration) {
	loadBefore := transport.LoadAverage()
	fleets := [2]*tiedFleet{newTiedFleet(t, proto, false, 1), newTiedFleet(t, proto, true, 2)}
	defer func() {
		for _, f := range fleets {
			f.close()
		}
	}()
	tiedProbe(t, proto, fleets[0], true)
	tiedProbe(t, proto, fleets[1], false)
	rate := load * tiedCapacity()
	runs := make([][]tiedFigures, tiedRuns)
	for run := range tiedRuns {
		runs[run] = tiedRun(t, proto, fleets, uint64(run+1), rate, slice)
	}
	tiedReport(t, proto, load, rate, slice, runs, loadBefore)
}

// tiedRun is one run: new clients for each configuration, a warm-up slice
// for each, then tiedSlices slices for each, in an order shuffled each
// round, each configuration's k-th slice with the same arrivals. Calls
// outlive their slice; the servers count each request for the
// configuration its tiedConfigHeader names.
func tiedRun(t *testing.T, proto string, fleets [2]*tiedFleet, seed uint64, rate float64, slice time.Duration) []tiedFigures {
	figs := make([]tiedFigures, len(tiedConfigs))
	clients := make([]*tiedClientSet, len(tiedConfigs))
	for i, c := range tiedConfigs {
		clients[i] = newTiedClients(t, proto, c, fleets[b2i(c.plain)])
	}
	var calls tiedCalls
	// settle waits for the calls and the fleets, and returns what the
	// servers counted for each configuration so far.
	settle := func() []tiedTally {
		calls.wg.Wait()
		for _, f := range fleets {
			if !f.waitIdle(tiedDrain) {
				t.Errorf("run %d: a fleet was still busy %v after its calls returned", seed, tiedDrain)
			}
		}
		tallies := make([]tiedTally, len(tiedConfigs))
		for i, c := range tiedConfigs {
			tallies[i] = fleets[b2i(c.plain)].tally(i)
		}
		return tallies
	}

	warm := make([]tiedFigures, len(tiedConfigs))
	for i, c := range tiedConfigs {
		arrivals := rand.New(rand.NewPCG(seed, 0))
		calls.send(clients[i], i, fleets[b2i(c.plain)], arrivals, rate, tiedWarm, &warm[i])
	}
	before := settle()
	for k := range tiedSlices {
		order := rand.New(rand.NewPCG(seed, uint64(1000+k))).Perm(len(tiedConfigs))
		for _, i := range order {
			arrivals := rand.New(rand.NewPCG(seed, uint64(k+1)))
			calls.send(clients[i], i, fleets[b2i(tiedConfigs[i].plain)], arrivals, rate, slice, &figs[i])
		}
	}
	after := settle()
	for i, c := range clients {
		figs[i].srv = after[i].sub(before[i])
		figs[i].warmCalls, figs[i].warmWire = warm[i].calls, warm[i].wire
		figs[i].discarded = c.discarded.Load()
		c.mu.Lock()
		figs[i].suppressed = maps.Clone(c.suppressed)
		c.mu.Unlock()
		c.close()
	}
	return figs
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// tiedConfigHeader names the configuration a call is of, for the servers'
// counts; the transports send it on every leg.
const tiedConfigHeader = "Tied-Config"

// tiedCalls are a run's calls in flight, and the lock of the figures
// they add to.
type tiedCalls struct {
	wg sync.WaitGroup
	mu sync.Mutex
}

// send starts one slice of configuration i's calls through c, Poisson
// arrivals drawn from arrivals, each in a goroutine that adds its figures
// to fig, and returns after the last arrival.
func (calls *tiedCalls) send(c *tiedClientSet, i int, f *tiedFleet, arrivals *rand.Rand, rate float64, d time.Duration, fig *tiedFigures) {
	start := time.Now()
	url := "http://" + f.addrs[0] + "/"
	config := strconv.Itoa(i)
	next := time.Duration(0)
	for n := 0; ; n++ {
		next = tiedNextArrival(next, rate, arrivals.ExpFloat64())
		if next >= d {
			return
		}
		time.Sleep(time.Until(start.Add(next)))
		cl := c.clients[n%len(c.clients)]
		calls.wg.Go(func() {
			rep := &transport.Report{}
			ctx, cancel := context.WithTimeout(transport.WithReport(context.Background(), rep), tiedDeadline)
			defer cancel()
			began := time.Now()
			ok := tiedCall(ctx, cl, url, config)
			took := time.Since(began)
			calls.mu.Lock()
			defer calls.mu.Unlock()
			fig.lat = append(fig.lat, took)
			fig.calls++
			if !ok {
				fig.failed++
			}
			fig.wire += int64(rep.WireAttempts)
			fig.hedges += int64(rep.Hedges)
			if rep.HedgeWon {
				fig.won++
			}
		})
	}
}

// tiedCall makes one GET of configuration config and reports whether it
// got a 200, its body read.
func tiedCall(ctx context.Context, cl *http.Client, url, config string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	req.Header.Set(tiedConfigHeader, config)
	resp, err := cl.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == http.StatusOK
}

// tiedNextArrival returns the arrival after the one at at, for a Poisson
// process whose rate is 1.5 × mean in the even phases of tiedPhase from
// the slice's start and 0.5 × mean in the odd ones; e is an exponential
// draw of mean 1, spent across phase boundaries (the process's time
// rescaled by its rate), so that each phase gets its own rate exactly.
func tiedNextArrival(at time.Duration, mean, e float64) time.Duration {
	for {
		phase := at / tiedPhase
		r := 1.5 * mean
		if phase%2 == 1 {
			r = 0.5 * mean
		}
		end := (phase + 1) * tiedPhase
		left := (end - at).Seconds()
		if e <= r*left {
			return at + time.Duration(e/r*float64(time.Second))
		}
		e -= r * left
		at = end
	}
}

// tiedFigures are one configuration's figures over one run.
type tiedFigures struct {
	lat                              []time.Duration
	calls, failed, wire, hedges, won int64
	srv                              tiedTally
	// Over the run, its warm-up included: legs the transports cancelled
	// (AttemptDone, Discarded), and hedges suppressed by reason
	// (HedgeSuppressed).
	discarded  int64
	suppressed map[policy.SuppressReason]int64
	// The warm-up's calls and their wire attempts, which only the check
	// of what learning costs counts.
	warmCalls, warmWire int64
}

// tiedTally is what a fleet's servers counted.
type tiedTally struct {
	arrived  int64 // requests that reached a server
	executed int64 // handler executions: requests a worker took
	cut      int64 // executions whose caller went away before the service time was over
	gone     int64 // requests that left the queue because their caller went away (499)
	refused  int64 // refusals (503, 429)
	held     int64 // ns: the time the executions not cut held their worker
}

func (a tiedTally) add(b tiedTally) tiedTally {
	return tiedTally{a.arrived + b.arrived, a.executed + b.executed, a.cut + b.cut, a.gone + b.gone, a.refused + b.refused, a.held + b.held}
}

func (a tiedTally) sub(b tiedTally) tiedTally {
	return tiedTally{a.arrived - b.arrived, a.executed - b.executed, a.cut - b.cut, a.gone - b.gone, a.refused - b.refused, a.held - b.held}
}

// tiedClientSet is one configuration's client transports, for one run.
type tiedClientSet struct {
	clients   []*http.Client
	trs       []*transport.Transport
	discarded atomic.Int64

	mu         sync.Mutex
	suppressed map[policy.SuppressReason]int64
}

func newTiedClients(t *testing.T, proto string, c tiedConfig, f *tiedFleet) *tiedClientSet {
	cs := &tiedClientSet{suppressed: map[policy.SuppressReason]int64{}}
	for range tiedClients {
		base := tiedBase(proto)
		set := policy.Set{
			Attempts: 2,
			Retry:    &policy.Retry{},
			Replicas: &policy.Replicas{Endpoints: transport.Static(f.addrs...)},
		}
		if c.hedge != nil {
			h := *c.hedge
			set.Hedge = &h
		}
		tr, err := transport.New(transport.Config{Base: base, Policies: set, Observer: &policy.Observer{
			AttemptDone: func(a policy.AttemptInfo) {
				if a.Outcome == policy.Discarded {
					cs.discarded.Add(1)
				}
			},
			HedgeSuppressed: func(h policy.HedgeSuppression) {
				cs.mu.Lock()
				cs.suppressed[h.Reason]++
				cs.mu.Unlock()
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
		cs.trs = append(cs.trs, tr)
		cs.clients = append(cs.clients, &http.Client{Transport: tr})
	}
	return cs
}

func (cs *tiedClientSet) close() {
	for _, tr := range cs.trs {
		tr.CloseIdleConnections()
	}
}

// tiedProbe sends each replica of f one request marked as tied, with
// net/http alone, and checks that the start signal comes through the
// harness's wrappers (signals) or does not (the plain fleet). The slices
// count from what the servers counted before them, so the probes are in
// no figure.
func tiedProbe(t *testing.T, proto string, f *tiedFleet, signals bool) {
	t.Helper()
	base := tiedBase(proto)
	defer base.CloseIdleConnections()
	for _, addr := range f.addrs {
		started := false
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints && h.Get(httpx.TieHeader) == httpx.TieStarted {
				started = true
			}
			return nil
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, "http://"+addr+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpx.TieHeader, "1")
		resp, err := base.RoundTrip(req)
		if err != nil {
			t.Fatalf("probe of %s: %v", addr, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || started != signals {
			t.Fatalf("probe of %s: status %d, start signal %v, want 200 and %v", addr, resp.StatusCode, started, signals)
		}
	}
}

// tiedBase returns a client's base transport, speaking only proto.
func tiedBase(proto string) *http.Transport {
	base := cleanhttp.DefaultPooledTransport()
	base.MaxIdleConnsPerHost = 64
	base.Protocols = new(http.Protocols)
	switch proto {
	case "h1":
		base.Protocols.SetHTTP1(true)
	case "h2c":
		base.Protocols.SetUnencryptedHTTP2(true)
	}
	return base
}

// tiedFleet is four replicas, behind admission or plain, and a count of
// the requests in their servers, to wait for them to be idle.
type tiedFleet struct {
	reps  []*tiedReplica
	srvs  []*httptest.Server
	addrs []string

	mu   sync.Mutex
	busy int
	idle []chan struct{} // closed when busy falls to 0
}

func newTiedFleet(t *testing.T, proto string, plain bool, seed uint64) *tiedFleet {
	f := &tiedFleet{}
	for i := range tiedReplicas {
		r := newTiedReplica(t, f, plain, rand.New(rand.NewPCG(seed, uint64(i+1))))
		srv := httptest.NewUnstartedServer(r)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.Config.Protocols = new(http.Protocols)
		switch proto {
		case "h1":
			srv.Config.Protocols.SetHTTP1(true)
		case "h2c":
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
		}
		srv.Start()
		t.Cleanup(srv.Close)
		f.reps = append(f.reps, r)
		f.srvs = append(f.srvs, srv)
		f.addrs = append(f.addrs, srv.Listener.Addr().String())
	}
	return f
}

func (f *tiedFleet) enter() {
	f.mu.Lock()
	f.busy++
	f.mu.Unlock()
}

func (f *tiedFleet) exit() {
	f.mu.Lock()
	f.busy--
	if f.busy == 0 {
		for _, c := range f.idle {
			close(c)
		}
		f.idle = nil
	}
	f.mu.Unlock()
}

// waitIdle waits up to d for no request to be in the fleet's servers, and
// reports whether none is.
func (f *tiedFleet) waitIdle(d time.Duration) bool {
	f.mu.Lock()
	if f.busy == 0 {
		f.mu.Unlock()
		return true
	}
	c := make(chan struct{})
	f.idle = append(f.idle, c)
	f.mu.Unlock()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c:
		return true
	case <-timer.C:
		return false
	}
}

// tally returns what the fleet's servers counted for configuration i.
func (f *tiedFleet) tally(i int) tiedTally {
	var s tiedTally
	for _, r := range f.reps {
		c := &r.counts[i]
		s = s.add(tiedTally{c.arrived.Load(), c.executed.Load(), c.cut.Load(), c.gone.Load(), c.refused.Load(), c.held.Load()})
	}
	return s
}

func (f *tiedFleet) close() {
	for _, s := range f.srvs {
		s.Close()
	}
}

// tiedReplica is one replica: tiedWorkers workers, each request holding
// one for a lognormal service time, in front of them admission.Handler
// with its limiter fixed at the workers, or, plain, a FIFO queue of its
// own that says nothing when a request starts.
type tiedReplica struct {
	fleet *tiedFleet
	h     http.Handler // what ServeHTTP serves: admission, or queue

	// counts are by configuration (tiedConfigHeader); the last is for
	// requests that name none, the probes'.
	counts [len(tiedConfigs) + 1]tiedCounts

	mu   sync.Mutex
	rng  *rand.Rand
	busy int             // workers taken, plain only
	wait []chan struct{} // requests waiting for a worker, plain only
}

func newTiedReplica(t *testing.T, f *tiedFleet, plain bool, rng *rand.Rand) *tiedReplica {
	r := &tiedReplica{fleet: f, rng: rng}
	if plain {
		r.h = http.HandlerFunc(r.queue)
		return r
	}
	h, err := admission.Handler(http.HandlerFunc(r.work), admission.Config{
		Name:    "replica",
		Limiter: policy.Limiter{InitialLimit: tiedWorkers, MinLimit: tiedWorkers, MaxLimit: tiedWorkers, QueueFactor: tiedQueueFactor},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	return r
}

// tiedCounts are what a replica counted for one configuration, as
// tiedTally has them.
type tiedCounts struct {
	arrived, executed, cut, gone, refused, held atomic.Int64
}

// countsOf returns the counts of the configuration req names.
func (r *tiedReplica) countsOf(req *http.Request) *tiedCounts {
	i, err := strconv.Atoi(req.Header.Get(tiedConfigHeader))
	if err != nil || i < 0 || i >= len(tiedConfigs) {
		i = len(tiedConfigs)
	}
	return &r.counts[i]
}

func (r *tiedReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.fleet.enter()
	defer r.fleet.exit()
	c := r.countsOf(req)
	c.arrived.Add(1)
	r.h.ServeHTTP(&tiedGone{ResponseWriter: &refusals{ResponseWriter: w, n: &c.refused}, n: &c.gone}, req)
}

// queue is the plain replica: it waits, in order, for one of the
// workers, and leaves if its caller goes away first.
func (r *tiedReplica) queue(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	var turn chan struct{}
	if r.busy < tiedWorkers {
		r.busy++
	} else {
		turn = make(chan struct{})
		r.wait = append(r.wait, turn)
	}
	r.mu.Unlock()
	if turn != nil {
		select {
		case <-turn:
		case <-req.Context().Done():
			r.mu.Lock()
			i := slices.Index(r.wait, turn)
			if i >= 0 {
				r.wait = slices.Delete(r.wait, i, i+1)
			}
			r.mu.Unlock()
			if i < 0 {
				r.release() // granted as it gave up
			}
			r.countsOf(req).gone.Add(1)
			return
		}
	}
	defer r.release()
	r.work(w, req)
}

func (r *tiedReplica) release() {
	r.mu.Lock()
	r.busy--
	if len(r.wait) > 0 {
		close(r.wait[0])
		r.wait = r.wait[1:]
		r.busy++
	}
	r.mu.Unlock()
}

// work is a handler execution: it holds its worker for a service time,
// and lets it go when its caller goes away.
func (r *tiedReplica) work(w http.ResponseWriter, req *http.Request) {
	c := r.countsOf(req)
	c.executed.Add(1)
	r.mu.Lock()
	service := time.Duration(float64(tiedService) * math.Exp(tiedSigma*r.rng.NormFloat64()-tiedSigma*tiedSigma/2))
	r.mu.Unlock()
	began := time.Now()
	timer := time.NewTimer(service)
	defer timer.Stop()
	select {
	case <-timer.C:
		c.held.Add(int64(time.Since(began)))
		io.WriteString(w, "ok")
	case <-req.Context().Done():
		c.cut.Add(1)
	}
}

// tiedGone counts in n the requests admission answers 499: those whose
// caller went away while they waited in its queue. It passes every
// status on, the 103 that tells a tied request it started included.
type tiedGone struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (g *tiedGone) WriteHeader(code int) {
	if code == 499 {
		g.n.Add(1)
	}
	g.ResponseWriter.WriteHeader(code)
}

// tiedSummary is one configuration's figures over one run, reduced.
type tiedSummary struct {
	calls                                  int64
	p50, p99, p999                         time.Duration
	failed, gone, refused, discarded       int64
	wire, exec, hedged, won, arrived, held float64 // per call; held: ms per execution not cut
}

func (f *tiedFigures) summary() tiedSummary {
	lat := slices.Clone(f.lat)
	slices.Sort(lat)
	n := max(f.calls, 1)
	per := func(v int64) float64 { return float64(v) / float64(n) }
	return tiedSummary{
		calls: f.calls,
		p50:   fbQuantile(lat, 0.5), p99: fbQuantile(lat, 0.99), p999: fbQuantile(lat, 0.999),
		failed: f.failed, gone: f.srv.gone, refused: f.srv.refused, discarded: f.discarded,
		wire: per(f.wire), exec: per(f.srv.executed), hedged: per(f.hedges), won: per(f.won), arrived: per(f.srv.arrived),
		held: float64(f.srv.held) / float64(max(f.srv.executed-f.srv.cut, 1)) / 1e6,
	}
}

// tiedMedian returns the median of what of each run's summary.
func tiedMedian[T int64 | float64 | time.Duration](runs []tiedSummary, what func(tiedSummary) T) T {
	vs := make([]T, len(runs))
	for i, s := range runs {
		vs[i] = what(s)
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

func tiedReport(t *testing.T, proto string, load, rate float64, slice time.Duration, runs [][]tiedFigures, loadBefore string) {
	t.Helper()
	// sums[i] are configuration i's summaries, one a run.
	sums := make([][]tiedSummary, len(tiedConfigs))
	for _, run := range runs {
		for i := range run {
			sums[i] = append(sums[i], run[i].summary())
		}
	}
	tb := &figureTable{name: 20, cell: 10, cols: []string{"median of " + fmt.Sprint(len(runs)), "calls", "p50", "p99", "p99.9", "failed", "wire/call", "exec/call", "499s", "refusals"}}
	for i, c := range tiedConfigs {
		s := sums[i]
		tb.row(c.name,
			fmt.Sprint(tiedMedian(s, func(s tiedSummary) int64 { return s.calls })),
			replMS(tiedMedian(s, func(s tiedSummary) time.Duration { return s.p50 })),
			replMS(tiedMedian(s, func(s tiedSummary) time.Duration { return s.p99 })),
			replMS(tiedMedian(s, func(s tiedSummary) time.Duration { return s.p999 })),
			fmt.Sprint(tiedMedian(s, func(s tiedSummary) int64 { return s.failed })),
			fmt.Sprintf("%.3f", tiedMedian(s, func(s tiedSummary) float64 { return s.wire })),
			fmt.Sprintf("%.3f", tiedMedian(s, func(s tiedSummary) float64 { return s.exec })),
			fmt.Sprint(tiedMedian(s, func(s tiedSummary) int64 { return s.gone })),
			fmt.Sprint(tiedMedian(s, func(s tiedSummary) int64 { return s.refused })),
		)
	}
	var perRun []string
	for i, run := range runs {
		h, d, a := run[tiedHedge].summary(), run[tiedTied].summary(), run[tiedAgain].summary()
		perRun = append(perRun, fmt.Sprintf("run %d: tied/hedging p99 %.2f, p99.9 %.2f (hedging again/hedging %.2f, %.2f)", i+1,
			tiedRatio(d.p99, h.p99), tiedRatio(d.p999, h.p999), tiedRatio(a.p99, h.p99), tiedRatio(a.p999, h.p999)))
	}
	tb.note(strings.Join(perRun, "; "))
	for i, c := range tiedConfigs {
		s := sums[i]
		tb.note(fmt.Sprintf("%s: a call's hedges %.3f, won %.3f; hedges suppressed a call, all runs, warm-ups included: %s; requests at the servers a call %.3f; legs the clients discarded %d; a served request held its worker %.1fms (%v meant; a busy machine stretches it), so the fleet was %.0f%% busy",
			c.name,
			tiedMedian(s, func(s tiedSummary) float64 { return s.hedged }),
			tiedMedian(s, func(s tiedSummary) float64 { return s.won }),
			tiedSuppressed(runs, i),
			tiedMedian(s, func(s tiedSummary) float64 { return s.arrived }),
			tiedMedian(s, func(s tiedSummary) int64 { return s.discarded }),
			tiedMedian(s, func(s tiedSummary) float64 { return s.held }),
			tiedService,
			tiedMedian(s, func(s tiedSummary) float64 { return 100 * s.exec * rate * s.held / 1e3 / (tiedReplicas * tiedWorkers) })))
	}

	// ratios returns the median over the runs of configuration i's
	// quantile q over hedging's; spread, that of the larger over the
	// smaller.
	ratios := func(i int, q func(tiedSummary) time.Duration, spread bool) float64 {
		var rs []float64
		for _, run := range runs {
			r := tiedRatio(q(run[i].summary()), q(run[tiedHedge].summary()))
			if spread && r < 1 {
				r = 1 / r
			}
			rs = append(rs, r)
		}
		slices.Sort(rs)
		return rs[len(rs)/2]
	}
	p99 := func(s tiedSummary) time.Duration { return s.p99 }
	p999 := func(s tiedSummary) time.Duration { return s.p999 }
	p99r, p999r := ratios(tiedTied, p99, false), ratios(tiedTied, p999, false)
	noise := max(ratios(tiedAgain, p99, true), ratios(tiedAgain, p999, true))
	wire := func(i int) float64 { return tiedMedian(sums[i], func(s tiedSummary) float64 { return s.wire }) }
	tiedExec := tiedMedian(sums[tiedTied], func(s tiedSummary) float64 { return s.exec })
	more := fmt.Sprintf("tied's wire calls a call: %.3f against hedging's %.3f, %+.3f", wire(tiedTied), wire(tiedHedge), wire(tiedTied)-wire(tiedHedge))
	if wire(tiedHedge) > 1 {
		more += fmt.Sprintf(" (tied's extra calls %.1f× hedging's)", (wire(tiedTied)-1)/(wire(tiedHedge)-1))
	}
	tb.note(more)
	tb.note(fmt.Sprintf("load average: %s before, %s after", loadBefore, transport.LoadAverage()))
	tb.check(noise <= 1/tiedTailTarget, "%s at %.0f%%: the same chain's p99 or p99.9 twice (hedging, hedging again) %.2f× apart (median of runs): beyond %.2f×, the machine's noise is larger than the tail targets' margin, and they cannot be judged",
		proto, 100*load, noise, 1/tiedTailTarget)
	tb.check(p99r <= tiedTailTarget, "%s at %.0f%%: tied p99 %.2f× hedging's (median of runs), target <= %.1f×", proto, 100*load, p99r, tiedTailTarget)
	tb.check(p999r <= tiedTailTarget, "%s at %.0f%%: tied p99.9 %.2f× hedging's (median of runs), target <= %.1f×", proto, 100*load, p999r, tiedTailTarget)
	tb.check(tiedExec <= tiedExecTarget, "%s at %.0f%%: tied handler executions a call %.3f, target <= %.2f", proto, 100*load, tiedExec, tiedExecTarget)
	// extra is configuration i's wire calls a call above one, over every
	// run's calls, warm-ups included.
	extra := func(i int) float64 {
		var wire, calls int64
		for _, run := range runs {
			wire += run[i].wire + run[i].warmWire
			calls += run[i].calls + run[i].warmCalls
		}
		return tiedRatioF(float64(wire), float64(calls)) - 1
	}
	tb.note(fmt.Sprintf("against servers without admission, all runs, warm-ups included: extra wire calls a call, tied %.3f, hedging %.3f", extra(tiedPlainTied), extra(tiedPlainHedge)))
	tb.check(extra(tiedPlainTied) <= tiedLearnFactor*extra(tiedPlainHedge)+tiedLearnSlack, "%s at %.0f%%: against servers without admission, tied's extra wire calls a call %.3f against hedging's %.3f, target <= %.2f × hedging's + %.2f",
		proto, 100*load, extra(tiedPlainTied), extra(tiedPlainHedge), tiedLearnFactor, tiedLearnSlack)
	tb.log(t, fmt.Sprintf("tied requests, %s, %d replicas of %d workers (lognormal service, mean %v), %.0f calls/s (%.0f%% of %.0f; 1.5× and 0.5× in turns of %v), %d slices of %v a configuration a run, interleaved",
		proto, tiedReplicas, tiedWorkers, tiedService, rate, 100*load, tiedCapacity(), tiedPhase, tiedSlices, slice))
}

// tiedSuppressed returns configuration i's hedges suppressed a call, by
// reason, over every run's calls, warm-ups included.
func tiedSuppressed(runs [][]tiedFigures, i int) string {
	var calls int64
	by := map[policy.SuppressReason]int64{}
	for _, run := range runs {
		calls += run[i].calls + run[i].warmCalls
		for r, n := range run[i].suppressed {
			by[r] += n
		}
	}
	var out []string
	for r := policy.HedgeWarming; r <= policy.HedgeBodyTooLarge; r++ {
		if by[r] > 0 {
			out = append(out, fmt.Sprintf("%v %.3f", r, tiedRatioF(float64(by[r]), float64(calls))))
		}
	}
	if out == nil {
		return "none"
	}
	return strings.Join(out, ", ")
}

func tiedRatio(a, b time.Duration) float64 { return tiedRatioF(float64(a), float64(b)) }

func tiedRatioF(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}
