package otelmetrics_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// reports answers every request with a load report.
type reports string

func (v reports) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Endpoint-Load-Metrics", string(v))
}

// TestLaneLoad: resilix.lane.load and resilix.lane.load.age have a point
// for each lane whose server reports its load, by index, with the
// transport's snapshot's values.
func TestLaneLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		var net httptestutil.Network
		net.Listen("api:80", status(http.StatusOK))
		net.Listen("a:80", reports("TEXT application_utilization=0.25"))
		net.Listen("b:80", status(http.StatusOK)) // no report
		tr, err := transport.New(transport.Config{
			Base:     net.Transport(),
			Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: transport.Static("a:80", "b:80")}},
			Observer: obs,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		defer tr.CloseIdleConnections()
		get := func() {
			req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		get()
		synctest.Wait() // Endpoints answered
		for range 20 {
			get()
		}
		time.Sleep(1500 * time.Millisecond)

		m := tr.Measured("api")
		want := map[string]float64{}
		for i, l := range m.PerLane {
			if l.HasLoad {
				idx := policy.LaneName("", i)
				want["resilix.lane.load{key=api,lane="+idx+"}"] = l.Load
				want["resilix.lane.load.age{key=api,lane="+idx+"}"] = l.LoadAge.Seconds()
			}
		}
		if len(want) != 2 || want["resilix.lane.load{key=api,lane=0}"]+want["resilix.lane.load{key=api,lane=1}"] != 0.25 {
			t.Fatalf("Measured: one lane should report 0.25, got %v", want)
		}
		got := map[string]float64{}
		p := collect(t, reader)
		for k, v := range p.values {
			if len(k) > len("resilix.lane.load") && k[:len("resilix.lane.load")] == "resilix.lane.load" {
				got[k] = v
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("resilix.lane.load and .age (-want +got):\n%s", diff)
		}
		if p.units["resilix.lane.load"] != "1" || p.units["resilix.lane.load.age"] != "s" {
			t.Errorf("units %q, %q", p.units["resilix.lane.load"], p.units["resilix.lane.load.age"])
		}
	})
}
