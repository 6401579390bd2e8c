// Command prometheus exports resilix's metrics to Prometheus through
// OpenTelemetry.
//
// It starts a local upstream on loopback (mostly fast, sometimes slow, a
// few 503s), calls it through an http.Client whose transport is resilix
// with Retry, Hedge, Timeout and Breaker, records what resilix does with
// otelmetrics into an OpenTelemetry MeterProvider, and serves the
// OpenTelemetry Prometheus exporter's /metrics on loopback while it
// generates traffic:
//
//	go run . -addr 127.0.0.1:9464 -duration 10m -rate 100
//	curl -s 127.0.0.1:9464/metrics | grep '^resilix_'
//
// See README.md for the PromQL of the hedge win rate.
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
	"github.com/resilix/resilix/transport"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address of the /metrics endpoint")
	duration := flag.Duration("duration", 10*time.Minute, "how long to generate traffic")
	rate := flag.Float64("rate", 100, "calls per second")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	if err := run(ctx, *addr, *rate); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr string, rate float64) error {
	d, err := start(addr)
	if err != nil {
		return err
	}
	log.Printf("metrics on %s, upstream %s", d.metricsURL(), d.upstream.URL)
	n, trafficErr := d.traffic(ctx, -1, rate, 8)
	m := d.rt.Measured(d.key)
	log.Printf("%d calls; %d hedges started, %d won in the last hedge window", n, m.HedgesStarted, m.HedgesWon)
	if m.HasBreaker {
		log.Printf("breaker %v, error rate %.3f (trips at %.3f)", m.BreakerState, m.ErrorRate, m.TripPoint)
	}
	return errors.Join(trafficErr, d.close())
}

// demo is the running example: the upstream, the resilix client, and the
// /metrics server.
type demo struct {
	upstream *httptest.Server
	key      string // the upstream's host:port, resilix's key for it
	rt       *transport.Transport
	client   *http.Client
	provider *sdkmetric.MeterProvider
	metrics  *http.Server
	listener net.Listener
	served   chan error
}

// start starts the upstream, the client and the /metrics endpoint on addr
// (port 0 picks a free one).
func start(addr string) (*demo, error) {
	up := httptestutil.NewUpstream(httptestutil.Options{
		// 97% of calls take 2ms, 3% take 80ms: the tail hedging is for.
		Latency: httptestutil.Bimodal(2*time.Millisecond, 80*time.Millisecond, 0.03),
		Faults:  []httptestutil.Fault{{Probability: 0.02, Status: http.StatusServiceUnavailable}},
		Seed:    1,
	})

	// A registry of our own, rather than Prometheus's global one.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	obs, err := otelmetrics.New(provider)
	if err != nil {
		provider.Shutdown(context.Background())
		return nil, err
	}
	rt, err := transport.New(transport.Config{
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: 5 * time.Millisecond},
			Hedge:   &policy.Hedge{}, // after the 95th percentile of recent latency
			Timeout: &policy.Timeout{PerAttempt: 500 * time.Millisecond},
			Breaker: &policy.Breaker{},
		},
		Observer: obs,
	})
	if err != nil {
		provider.Shutdown(context.Background())
		return nil, err
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		provider.Shutdown(context.Background())
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	d := &demo{
		upstream: httptest.NewServer(up),
		rt:       rt,
		client:   &http.Client{Transport: rt},
		provider: provider,
		metrics:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		listener: ln,
		served:   make(chan error, 1),
	}
	d.key = strings.TrimPrefix(d.upstream.URL, "http://")
	go func() { d.served <- d.metrics.Serve(ln) }()
	return d, nil
}

func (d *demo) metricsURL() string { return "http://" + d.listener.Addr().String() + "/metrics" }

// traffic makes calls from workers goroutines, at most perSecond calls a
// second in all (no limit if perSecond <= 0), until ctx ends or, if calls
// >= 0, that many calls are made. It returns the number of calls made.
func (d *demo) traffic(ctx context.Context, calls int, perSecond float64, workers int) (int64, error) {
	var tick <-chan time.Time
	if perSecond > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
		defer t.Stop()
		tick = t.C
	}
	jobs := make(chan struct{})
	var (
		wg    sync.WaitGroup
		made  atomic.Int64
		errMu sync.Mutex
		first error
	)
	for range workers {
		wg.Go(func() {
			for range jobs {
				made.Add(1)
				if err := d.call(ctx); err != nil && ctx.Err() == nil {
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
		case jobs <- struct{}{}:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return made.Load(), first
}

// call makes one GET. A 503, a refusal by the breaker or an attempt that
// timed out is part of the demo; only another transport failure is an
// error.
func (d *demo) call(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.upstream.URL, nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if errors.Is(err, policy.ErrRejected) || errors.Is(err, policy.ErrAttemptTimeout) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", d.upstream.URL, err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
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
	return errors.Join(err, d.provider.Shutdown(ctx))
}
