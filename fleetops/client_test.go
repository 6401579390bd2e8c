package fleetops

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-cleanhttp"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// The client's load, as the harness sets it: an open loop of callsPerSec
// calls a second, 80% GET, 10% plain POST, 10% POST with an
// Idempotency-Key, each with a callDeadline.
const (
	callsPerSec  = 200
	callDeadline = 2 * time.Second
)

// A client is one process's side of the harness, set by the environment
// the harness gives it (see startClient).
type clientEnv struct {
	role    string // "nethttp" or "resilix"
	dns     string // dnsmasq's host:port
	url     string
	key     string // the resilix key of url, for Measured
	start   time.Time
	length  time.Duration // how long calls are started, from start
	out     string
	seed    uint64
	idStamp string // the prefix of each call's X-Fleet-Id
	ca      string // the replicas' certificate, "" in the clear
}

func clientEnvFrom() (clientEnv, error) {
	start, err := strconv.ParseInt(os.Getenv("FLEETOPS_START"), 10, 64)
	if err != nil {
		return clientEnv{}, fmt.Errorf("FLEETOPS_START: %w", err)
	}
	length, err := time.ParseDuration(os.Getenv("FLEETOPS_LENGTH"))
	if err != nil {
		return clientEnv{}, fmt.Errorf("FLEETOPS_LENGTH: %w", err)
	}
	seed, err := strconv.ParseUint(os.Getenv("FLEETOPS_SEED"), 10, 64)
	if err != nil {
		return clientEnv{}, fmt.Errorf("FLEETOPS_SEED: %w", err)
	}
	return clientEnv{
		role:    os.Getenv("FLEETOPS_ROLE"),
		dns:     os.Getenv("FLEETOPS_DNS"),
		url:     os.Getenv("FLEETOPS_URL"),
		key:     os.Getenv("FLEETOPS_KEY"),
		start:   time.Unix(0, start),
		length:  length,
		out:     os.Getenv("FLEETOPS_OUT"),
		seed:    seed,
		idStamp: os.Getenv("FLEETOPS_ID"),
		ca:      os.Getenv("FLEETOPS_CA"),
	}, nil
}

// resolverTo returns a resolver that asks the DNS server at addr, as a
// program in a cluster asks the cluster's DNS.
func resolverTo(addr string) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
}

// recorder collects a client's records, safe for concurrent use.
type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (r *recorder) add(rec record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) writeTo(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, rec := range r.recs {
		if err := enc.Encode(rec); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// laneIP is the IP of a lane's name (its address with Endpoints).
func laneIP(lane string) string {
	if host, _, err := net.SplitHostPort(lane); err == nil {
		return host
	}
	return lane
}

// runClient is a client process's life: calls from env.start for
// env.length, then the records written to env.out.
func runClient(env clientEnv) error {
	res := resolverTo(env.dns)
	var rec recorder
	var rt http.RoundTripper
	var measured func() int
	// base is go-cleanhttp's pooled transport, trusting the replicas'
	// certificate over TLS (HTTP/2, as ForceAttemptHTTP2 asks).
	base := cleanhttp.DefaultPooledTransport()
	if env.ca != "" {
		pem, err := os.ReadFile(env.ca)
		if err != nil {
			return err
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("FLEETOPS_CA %s: no certificate", env.ca)
		}
		base.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
	switch env.role {
	case "nethttp":
		base.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Resolver: res}).DialContext
		rt = base
	case "resilix":
		lane := func(typ string) func(policy.LaneEjection) {
			return func(e policy.LaneEjection) {
				rec.add(record{Type: typ, T: time.Now().UnixNano(), Replica: laneIP(e.Addr), Reason: e.Reason.String(), Lat: int64(e.For)})
			}
		}
		obs := &policy.Observer{
			LaneEjected:  lane("eject"),
			LaneReturned: lane("return"),
			AttemptDone: func(a policy.AttemptInfo) {
				r := record{Type: "attempt", T: time.Now().Add(-a.Latency).UnixNano(), Replica: laneIP(a.Lane), Status: a.StatusCode, Lat: int64(a.Latency), Reason: a.Outcome.String()}
				if a.Err != nil {
					r.Err = a.Err.Error()
				}
				rec.add(r)
			},
		}
		tr, err := transport.New(transport.Config{
			Base: base,
			Policies: policy.Set{
				Attempts: 3,
				Retry:    &policy.Retry{},
				Hedge:    &policy.Hedge{},
				Breaker:  &policy.Breaker{},
				Timeout:  &policy.Timeout{PerAttempt: time.Second},
				Replicas: &policy.Replicas{Endpoints: transport.DNSWith(res)}, // as docs/replicas.md shows
			},
			Observer: obs,
		})
		if err != nil {
			return err
		}
		defer tr.CloseIdleConnections()
		rt = tr
		measured = func() int { return tr.Measured(env.key).Lanes }
	default:
		return fmt.Errorf("FLEETOPS_ROLE %q: want nethttp or resilix", env.role)
	}
	client := &http.Client{Transport: rt}
	time.Sleep(time.Until(env.start))
	end := env.start.Add(env.length)

	// The resilix key's count of lanes, watched so that the harness can
	// tell when a refresh changed the set.
	stop := make(chan struct{})
	var watched sync.WaitGroup
	if measured != nil {
		watched.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			last := -1
			for {
				select {
				case <-stop:
					return
				case now := <-tick.C:
					if n := measured(); n != last {
						rec.add(record{Type: "lanes", T: now.UnixNano(), N: n})
						last = n
					}
				}
			}
		})
	}

	rng := rand.New(rand.NewPCG(env.seed, 0x31))
	tick := time.NewTicker(time.Second / callsPerSec)
	var calls sync.WaitGroup
	for seq := 0; ; seq++ {
		now := <-tick.C
		if !now.Before(end) {
			break
		}
		kind := "get"
		switch d := rng.IntN(10); {
		case d == 0:
			kind = "post"
		case d == 1:
			kind = "keyed"
		}
		id := env.idStamp + "-" + strconv.Itoa(seq)
		calls.Go(func() { rec.add(call(client, env.url, kind, id)) })
	}
	tick.Stop()
	calls.Wait()
	close(stop)
	watched.Wait()
	return rec.writeTo(env.out)
}

// call makes one call and returns its record.
func call(client *http.Client, url, kind, id string) record {
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	method, body := http.MethodGet, io.Reader(nil)
	if kind != "get" {
		method, body = http.MethodPost, strings.NewReader("fleet")
	}
	r := record{Type: "call", Kind: kind}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	req.Header.Set("X-Fleet-Id", id)
	if kind == "keyed" {
		req.Header.Set("Idempotency-Key", id)
	}
	start := time.Now()
	r.T = start.UnixNano()
	resp, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.Status = resp.StatusCode
		r.Replica = resp.Header.Get("X-Replica")
		r.Proto = resp.Proto
	}
	r.Lat = int64(time.Since(start))
	if err != nil {
		r.Err = err.Error()
	}
	return r
}
