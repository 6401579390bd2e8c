package otelmetrics_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// replica answers with its status after a millisecond, and with a
// Retry-After if it has one.
type replica struct {
	status     int
	retryAfter string
}

func (r replica) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	time.Sleep(time.Millisecond)
	if r.retryAfter != "" {
		w.Header().Set("Retry-After", r.retryAfter)
	}
	w.WriteHeader(r.status)
}

// TestABadReplicaShows drives two keys of four replicas each with
// Replicas' defaults, one replica of each bad: key api's d:80 answers
// every call 503 until it is ejected, key pushy's h:80 answers 503 with a
// Retry-After of two minutes. resilix.lane.state must say ejected and
// held for them and open for the others, and resilix.lane.attempts give
// each bad replica a small share of its key's attempts; the same points
// come named by address (Options.LaneAddresses) and by index (the
// default), the index being the lane's in Transport.Measured.
func TestABadReplicaShows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		byAddr, obsAddr := newObserverWith(t, otelmetrics.Options{LaneAddresses: true})
		byIndex, obsIndex := newObserverWith(t, otelmetrics.Options{})
		var net httptestutil.Network
		defer net.Close()
		sets := map[string]policy.Set{}
		for key, addrs := range map[string][]string{"api": {"a:80", "b:80", "c:80", "d:80"}, "pushy": {"e:80", "f:80", "g:80", "h:80"}} {
			net.Listen(key+":80", replica{status: http.StatusOK}) // until Endpoints answers
			for _, a := range addrs {
				r := replica{status: http.StatusOK}
				switch a {
				case "d:80":
					r.status = http.StatusServiceUnavailable
				case "h:80":
					r = replica{http.StatusServiceUnavailable, "120"}
				}
				net.Listen(a, r)
			}
			sets[key] = policy.Set{
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Budget:   policy.Budget{Ratio: -1},
				Replicas: &policy.Replicas{Endpoints: transport.Static(addrs...)},
			}
		}
		tr, err := transport.New(transport.Config{
			Base:     net.Transport(),
			PerKey:   sets,
			Observer: policy.JoinObservers(obsAddr, obsIndex),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.CloseIdleConnections()
		get := func(host string) {
			req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", host, err)
			}
			resp.Body.Close()
		}
		// A call of each key every 20ms until d:80 is ejected (its
		// failures in a row reach ConsecutiveFailures, 5, as picking
		// tries it again while its failure penalty fades), then 200 more.
		ejected := func() bool {
			m := tr.Measured("api")
			for _, l := range m.PerLane {
				if l.Addr == "d:80" {
					return l.State == policy.LaneEjected
				}
			}
			return false
		}
		for i := 0; i < 200; {
			get("api")
			get("pushy")
			time.Sleep(20 * time.Millisecond)
			if i > 0 || ejected() {
				i++
			}
		}

		addrPoints := lanePoints(t, byAddr)
		indexPoints := lanePoints(t, byIndex)
		for _, key := range []string{"api", "pushy"} {
			m := tr.Measured(key)
			var total float64
			for k, v := range addrPoints {
				if strings.HasPrefix(k, "resilix.lane.attempts{key="+key+",") {
					total += v
				}
			}
			n := 0
			for i, l := range m.PerLane {
				if l.State == 0 {
					continue
				}
				n++
				state := addrPoints["resilix.lane.state{key="+key+",lane="+l.Addr+"}"]
				if got := indexPoints["resilix.lane.state{key="+key+",lane="+strconv.Itoa(i)+"}"]; got != state {
					t.Errorf("%s lane %d (%s): state %v by index, %v by address", key, i, l.Addr, got, state)
				}
				attempts := 0.0
				for _, o := range []string{"success", "failure"} {
					byA := addrPoints["resilix.lane.attempts{key="+key+",lane="+l.Addr+",outcome="+o+"}"]
					byI := indexPoints["resilix.lane.attempts{key="+key+",lane="+strconv.Itoa(i)+",outcome="+o+"}"]
					// Index 0 was also the lane of the key's first call,
					// sent to the request's own address before Endpoints
					// answered: lane "0" by address too.
					if i == 0 {
						byI -= addrPoints["resilix.lane.attempts{key="+key+",lane=0,outcome="+o+"}"]
					}
					if byA != byI {
						t.Errorf("%s lane %d (%s): %v attempts with outcome %s by index, %v by address", key, i, l.Addr, byI, o, byA)
					}
					attempts += byA
				}
				share := attempts / total
				t.Logf("%s %s (lane %d): state %v, %.0f attempts, share %.3f", key, l.Addr, i, policy.LaneState(state), attempts, share)
				switch bad := l.Addr == "d:80" || l.Addr == "h:80"; {
				case l.Addr == "d:80" && state != float64(policy.LaneEjected),
					l.Addr == "h:80" && state != float64(policy.LaneHeld),
					!bad && state != float64(policy.LaneOpen):
					t.Errorf("%s: state %v", l.Addr, policy.LaneState(state))
				case bad && share > 0.05:
					t.Errorf("%s: %.3f of the key's attempts, want at most 0.05", l.Addr, share)
				case !bad && share < 0.2:
					t.Errorf("%s: %.3f of the key's attempts, want at least 0.2", l.Addr, share)
				}
				if state != float64(l.State) {
					t.Errorf("%s: state %v, Measured says %v", l.Addr, policy.LaneState(state), l.State)
				}
			}
			if n != 4 {
				t.Errorf("%s: %d lanes, want 4", key, n)
			}
		}
	})
}

// lanePoints returns the points of resilix.lane.attempts and
// resilix.lane.state that reader collects.
func lanePoints(t *testing.T, reader sdkmetric.Reader) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for k, v := range collect(t, reader).values {
		if strings.HasPrefix(k, "resilix.lane.") {
			got[k] = v
		}
	}
	return got
}

func newObserverWith(t *testing.T, o otelmetrics.Options) (*sdkmetric.ManualReader, *policy.Observer) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := otelmetrics.NewWith(mp, o)
	if err != nil {
		t.Fatal(err)
	}
	return reader, obs
}

// TestLaneAttemptAllocatesNothing: once its key's and lane's attributes
// are cached, an attempt on a lane is counted without allocating, its lane
// named by index or by address.
func TestLaneAttemptAllocatesNothing(t *testing.T) {
	for _, o := range []otelmetrics.Options{{}, {LaneAddresses: true}} {
		_, obs := newObserverWith(t, o)
		a := policy.AttemptInfo{Context: t.Context(), Key: "api", Kind: policy.AttemptFirst, Outcome: policy.Success, Lane: "10.0.0.7:443", LaneIndex: 3}
		obs.AttemptDone(a)
		if n := testing.AllocsPerRun(200, func() { obs.AttemptDone(a) }); n != 0 {
			t.Errorf("%+v: a warm AttemptDone on a lane allocates %v times, want 0", o, n)
		}
	}
}
