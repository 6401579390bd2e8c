// Command prometheus exports resilix's metrics to Prometheus through
// OpenTelemetry, while a scripted incident makes every event of the
// dashboard beside it (dashboard.json) happen.
//
// It starts a local upstream on loopback (mostly fast, sometimes slow, a
// few 503s), calls it through an http.Client whose transport is resilix
// with Retry, Hedge, Timeout, Breaker, Throttler and Limiter, and, beside
// it, a fleet of three replicas, one of which answers every call 503, that
// resilix reaches over lanes (policy.Replicas); it records what
// resilix does with otelmetrics into an OpenTelemetry MeterProvider, and
// serves the OpenTelemetry Prometheus exporter's /metrics on loopback
// while it generates traffic, in a cycle of phases (see scenario):
//
//	go run . -addr 127.0.0.1:9464 -duration 10m -rate 100
//	curl -s 127.0.0.1:9464/metrics | grep '^resilix_'
//
// See README.md for the dashboard, the rules and the PromQL.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address of the /metrics endpoint")
	duration := flag.Duration("duration", 10*time.Minute, "how long to generate traffic")
	rate := flag.Float64("rate", 100, "calls per second")
	cycle := flag.Duration("cycle", 3*time.Minute, "length of one cycle of the scenario's phases")
	flag.Parse()
	if *cycle < time.Second {
		log.Fatalf("-cycle %v: want at least 1s", *cycle)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	if err := run(ctx, *addr, newScenario(*cycle, *rate)); err != nil {
		log.Fatal(err)
	}
}

// run serves /metrics on addr and plays s over and over until ctx ends.
func run(ctx context.Context, addr string, s scenario) error {
	d, err := start(addr)
	if err != nil {
		return err
	}
	log.Printf("metrics on %s, upstream %s, fleet %s", d.metricsURL(), d.upstream.URL, d.fleetURL)
	var playErr error
	for ctx.Err() == nil && playErr == nil {
		playErr = d.play(ctx, s, log.Printf)
	}
	m := d.rt.Measured(d.key)
	log.Printf("%d hedges started, %d won in the last hedge window; breaker %v", m.HedgesStarted, m.HedgesWon, m.BreakerState)
	return errors.Join(playErr, d.close())
}

// The upstream's usual latency and faults: 97% of calls take 2ms, 3% take
// 80ms (the tail hedging is for), and 2% answer 503.
var (
	usualLatency = httptestutil.Bimodal(2*time.Millisecond, 80*time.Millisecond, 0.03)
	usualFaults  = []httptestutil.Fault{{Probability: 0.02, Status: http.StatusServiceUnavailable}}
)

// demo is the running example: the upstream, the fleet, the resilix client, and the
// /metrics server.
type demo struct {
	upstream *httptest.Server
	up       *httptestutil.Upstream
	// limit is in front of up during the limited phase.
	limit    atomic.Pointer[httptestutil.RateLimit]
	key      string // the upstream's host:port, resilix's key for it
	rt       *transport.Transport
	client   *http.Client
	provider *sdkmetric.MeterProvider
	metrics  *http.Server
	listener net.Listener
	served   chan error

	// fleet is the replicas of the fleet, the last of them bad; fleetURL
	// is the first one's, and fleetKey resilix's key for the fleet.
	fleet    []*httptest.Server
	fleetURL string
	fleetKey string
}

// start starts the upstream, the client and the /metrics endpoint on addr
// (port 0 picks a free one).
func start(addr string) (*demo, error) {
	// A registry of our own, rather than Prometheus's global one.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	// The fleet's lanes are named by their addresses, which are three and
	// fixed here; where replicas come and go, leave lanes named by index.
	obs, err := otelmetrics.NewWith(provider, otelmetrics.Options{LaneAddresses: true})
	if err != nil {
		provider.Shutdown(context.Background())
		return nil, err
	}
	fleet, fleetAddrs := startFleet()
	fleetKey := fleetAddrs[0]
	rt, err := transport.New(transport.Config{
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: 5 * time.Millisecond},
			Hedge:   &policy.Hedge{}, // after the 95th percentile of recent latency
			Timeout: &policy.Timeout{PerAttempt: 500 * time.Millisecond},
			Breaker: &policy.Breaker{},
			// The throttler's window is the default's 2m cut to the
			// length of the scenario's phases, so that a phase's
			// refusals are not still held against the next one.
			Throttler: &policy.Throttler{Window: 10 * time.Second},
			// A limit that the flood's 32 callers exceed and the usual
			// eight never reach.
			Limiter: &policy.Limiter{MaxLimit: 16},
		},
		PerKey: map[string]policy.Set{
			// The fleet: each replica a lane; the bad one is ejected,
			// and the retry of a call it failed goes to another lane.
			fleetKey: {
				Retry:    &policy.Retry{BaseDelay: 5 * time.Millisecond},
				Hedge:    &policy.Hedge{},
				Timeout:  &policy.Timeout{PerAttempt: 500 * time.Millisecond},
				Replicas: &policy.Replicas{Endpoints: transport.Static(fleetAddrs...)},
			},
		},
		Observer: obs,
	})
	if err != nil {
		closeAll(fleet)
		provider.Shutdown(context.Background())
		return nil, err
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		closeAll(fleet)
		provider.Shutdown(context.Background())
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	d := &demo{
		up: httptestutil.NewUpstream(httptestutil.Options{
			Latency: usualLatency,
			Faults:  usualFaults,
			Seed:    1,
		}),
		rt:       rt,
		client:   &http.Client{Transport: rt},
		provider: provider,
		metrics:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		listener: ln,
		served:   make(chan error, 1),
		fleet:    fleet,
		fleetURL: "http://" + fleetKey,
		fleetKey: fleetKey,
	}
	d.upstream = httptest.NewServer(http.HandlerFunc(d.serveUpstream))
	d.key = strings.TrimPrefix(d.upstream.URL, "http://")
	go func() { d.served <- d.metrics.Serve(ln) }()
	return d, nil
}

// fleetSize is the number of the fleet's replicas; the last is bad.
const fleetSize = 3

// startFleet starts the fleet's replicas on loopback and returns them and
// their addresses. Each is an upstream of the usual latency and faults,
// but the last, which answers every call 503: a replica whose own
// dependency is gone.
func startFleet() ([]*httptest.Server, []string) {
	var servers []*httptest.Server
	var addrs []string
	for i := range fleetSize {
		var h http.Handler = httptestutil.NewUpstream(httptestutil.Options{
			Latency: usualLatency,
			Faults:  usualFaults,
			Seed:    uint64(2 + i),
		})
		if i == fleetSize-1 {
			h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			})
		}
		s := httptest.NewServer(h)
		servers = append(servers, s)
		addrs = append(addrs, strings.TrimPrefix(s.URL, "http://"))
	}
	return servers, addrs
}

func closeAll(servers []*httptest.Server) {
	for _, s := range servers {
		s.Close()
	}
}

// serveUpstream is the upstream's handler: d.up, behind d.limit during
// the limited phase.
func (d *demo) serveUpstream(w http.ResponseWriter, r *http.Request) {
	if l := d.limit.Load(); l != nil {
		l.ServeHTTP(w, r)
		return
	}
	d.up.ServeHTTP(w, r)
}

func (d *demo) metricsURL() string { return "http://" + d.listener.Addr().String() + "/metrics" }

// scenario is one cycle of an incident, phase by phase, at Rate calls a
// second from eight callers whose calls are, in turn, half Critical, a
// fifth Degraded, a tenth BestEffort and a fifth Bulk:
//
//   - Steady: the usual upstream. Hedges win against its slow tail, and
//     the first ones are suppressed while the latency window warms.
//   - Flood: 32 more callers send Bulk calls in closed loops against an
//     upstream taking 20ms a call; the limiter, whose limit is at most 16
//     with a queue of half that, sheds them.
//   - Storm: every answer is a 503, half of them with a Retry-After of
//     60s, longer than Retry.MaxRetryAfter. Retries are skipped (budget,
//     retry_after, and gate once the breaker refuses them), hedges are
//     suppressed (health), and the breaker opens and refuses every call.
//   - Recover: the usual upstream again; the breaker closes.
//   - Limited: the upstream admits half of Rate and answers the rest 429
//     with Retry-After 1. The throttler's pushback paces the Bulk and
//     BestEffort calls, refusing what goes beyond the pace.
//   - Calm: the usual upstream.
//
// In every phase, two more callers call the fleet at a quarter of Rate.
type scenario struct {
	Steady, Flood, Storm, Recover, Limited, Calm time.Duration

	Rate float64
}

// newScenario returns a scenario whose cycle lasts about cycle.
func newScenario(cycle time.Duration, rate float64) scenario {
	part := cycle / 12
	return scenario{
		Steady: 3 * part, Flood: part, Storm: 2 * part,
		Recover: 2 * part, Limited: 2 * part, Calm: 2 * part,
		Rate: rate,
	}
}

// play runs one cycle of s; it returns early, with no error, when ctx
// ends. logf, if not nil, hears each phase as it starts.
func (d *demo) play(ctx context.Context, s scenario, logf func(string, ...any)) error {
	usual := func() {
		d.limit.Store(nil)
		d.up.SetLatency(usualLatency)
		d.up.SetFaults(usualFaults...)
	}
	phases := []struct {
		name  string
		d     time.Duration
		setup func()
		flood bool
	}{
		{"steady", s.Steady, usual, false},
		{"flood", s.Flood, func() {
			usual()
			d.up.SetLatency(httptestutil.Constant(20 * time.Millisecond))
		}, true},
		{"storm", s.Storm, func() {
			usual()
			d.up.SetFaults(
				httptestutil.Fault{Probability: 0.5, Status: http.StatusServiceUnavailable, RetryAfter: "60"},
				httptestutil.Fault{Probability: 1, Status: http.StatusServiceUnavailable},
			)
		}, false},
		{"recover", s.Recover, usual, false},
		{"limited", s.Limited, func() {
			usual()
			d.limit.Store(httptestutil.NewRateLimit(d.up, httptestutil.RateLimitOptions{
				PerSecond: s.Rate / 2, Burst: 5, RetryAfter: "1",
			}))
		}, false},
		{"calm", s.Calm, usual, false},
	}
	defer usual()
	for _, p := range phases {
		if ctx.Err() != nil {
			return nil
		}
		if logf != nil {
			logf("phase %s for %v", p.name, p.d)
		}
		p.setup()
		pctx, cancel := context.WithTimeout(ctx, p.d)
		var wg sync.WaitGroup
		if p.flood {
			wg.Go(func() { d.flood(pctx, 32) })
		}
		var fleetErr error
		wg.Go(func() { _, fleetErr = d.traffic(pctx, d.fleetURL, -1, s.Rate/4, 2) })
		_, err := d.traffic(pctx, d.upstream.URL, -1, s.Rate, 8)
		wg.Wait()
		cancel()
		if err := errors.Join(err, fleetErr); err != nil {
			return fmt.Errorf("phase %s: %w", p.name, err)
		}
	}
	return nil
}

// priorities is the mix of the callers' calls, taken in turn.
var priorities = [10]shedding.Priority{
	shedding.Critical, shedding.Critical, shedding.Critical, shedding.Critical, shedding.Critical,
	shedding.Degraded, shedding.Degraded, shedding.BestEffort, shedding.Bulk, shedding.Bulk,
}

// traffic makes calls to url from workers goroutines, at most perSecond
// calls a second in all (no limit if perSecond <= 0), until ctx ends or, if
// calls >= 0, that many calls are made. It returns the number of calls
// made.
func (d *demo) traffic(ctx context.Context, url string, calls int, perSecond float64, workers int) (int64, error) {
	var tick <-chan time.Time
	if perSecond > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
		defer t.Stop()
		tick = t.C
	}
	jobs := make(chan shedding.Priority)
	var (
		wg    sync.WaitGroup
		made  atomic.Int64
		errMu sync.Mutex
		first error
	)
	for range workers {
		wg.Go(func() {
			for prio := range jobs {
				made.Add(1)
				if _, err := d.call(ctx, url, prio); err != nil && ctx.Err() == nil {
					errMu.Lock()
					first = cmp.Or(first, err)
					errMu.Unlock()
				}
			}
		})
	}
feed:
	for i := 0; calls < 0 || i < calls; i++ {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				break feed
			}
		}
		select {
		case jobs <- priorities[i%len(priorities)]:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return made.Load(), first
}

// flood makes Bulk calls from callers goroutines in closed loops until ctx
// ends. A caller refused pauses 50ms before calling again, as a batch job
// backs off.
func (d *demo) flood(ctx context.Context, callers int) {
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				refused, _ := d.call(ctx, d.upstream.URL, shedding.Bulk)
				if refused {
					select {
					case <-time.After(50 * time.Millisecond):
					case <-ctx.Done():
					}
				}
			}
		})
	}
	wg.Wait()
}

// call makes one GET of url with priority prio, and reports whether a
// gate refused it. A 503, a refusal, an attempt that timed out or a call
// past its deadline is part of the demo; only another transport failure
// is an error.
func (d *demo) call(ctx context.Context, url string, prio shedding.Priority) (refused bool, err error) {
	ctx, cancel := context.WithTimeout(shedding.WithPriority(ctx, prio), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := d.client.Do(req)
	if errors.Is(err, policy.ErrRejected) {
		return true, nil
	}
	if errors.Is(err, policy.ErrAttemptTimeout) || errors.Is(err, context.DeadlineExceeded) {
		// An attempt timed out, or the call ran out of its caller's
		// time (its own, or the phase's end).
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return false, err
}

// close stops the /metrics server, the upstream and the client's
// connections, and shuts the MeterProvider down.
func (d *demo) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := d.metrics.Shutdown(ctx)
	if serr := <-d.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	d.rt.CloseIdleConnections()
	d.upstream.Close()
	closeAll(d.fleet)
	return errors.Join(err, d.provider.Shutdown(ctx))
}
