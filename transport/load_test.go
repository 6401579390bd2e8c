package transport

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
)

// reporter is a replica that answers with status and the load report
// value it holds, both settable while it serves.
type reporter struct {
	value  atomic.Value // string: the endpoint-load-metrics value; "" none
	status atomic.Int64 // 0: 200
}

func (r *reporter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if v, _ := r.value.Load().(string); v != "" {
		w.Header().Set("endpoint-load-metrics", v)
	}
	if s := r.status.Load(); s != 0 {
		w.WriteHeader(int(s))
	}
}

// laneAt returns the lane of m whose address is addr.
func laneAt(t *testing.T, m policy.Snapshot, addr string) policy.LaneSnapshot {
	t.Helper()
	for _, l := range m.PerLane {
		if l.Addr == addr {
			return l
		}
	}
	t.Fatalf("no lane at %s in %+v", addr, m.PerLane)
	return policy.LaneSnapshot{}
}

// TestLaneLoadReports: each lane keeps its server's last report, with its
// age, in Measured: resilix's own named metrics, another server's
// application_utilization, vLLM's KV cache share; a lane whose server
// sends none has none.
func TestLaneLoadReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		reps := map[string]*reporter{}
		for addr, v := range map[string]string{
			"a:80": string(orca.AppendText(nil, 10, 3, 4, 1)),
			"b:80": "TEXT application_utilization=0.25, cpu_utilization=0.9",
			"c:80": "TEXT named_metrics.kv_cache_usage_perc=0.5, named_metrics.num_requests_waiting=2.0",
			"d:80": "",
		} {
			r := new(reporter)
			r.value.Store(v)
			reps[addr] = r
			f.net.Listen(addr, r)
		}
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static(four...)}}})
		prime(t, rt, "http://api/")
		for range 40 {
			laneGet(t, rt, "http://api/", "")
		}
		m := rt.Measured("api")
		for addr, want := range map[string]float64{"a:80": 1, "b:80": 0.25, "c:80": 0.5} {
			if l := laneAt(t, m, addr); !l.HasLoad || l.Load != want || l.LoadAge != 0 {
				t.Errorf("lane %s: HasLoad %v, Load %v, age %v; want true, %v, 0", addr, l.HasLoad, l.Load, l.LoadAge, want)
			}
		}
		if l := laneAt(t, m, "d:80"); l.HasLoad || l.Load != 0 || l.LoadAge != 0 {
			t.Errorf("lane d:80, which sends no report: %+v", l)
		}
		time.Sleep(3 * time.Second)
		if l := laneAt(t, rt.Measured("api"), "b:80"); !l.HasLoad || l.Load != 0.25 || l.LoadAge != 3*time.Second {
			t.Errorf("lane b:80 3 s on: HasLoad %v, Load %v, age %v; want true, 0.25, 3s", l.HasLoad, l.Load, l.LoadAge)
		}
		if n := testing.AllocsPerRun(100, func() { rt.Measured("api") }); n != 0 {
			t.Errorf("Measured with load reports allocates %v times", n)
		}
	})
}

// TestHostileLoadReportsAreIgnoredAndCounted: a value out of bounds or
// out of form leaves the lane's last report as it was, and is counted as
// a malformed header.
func TestHostileLoadReportsAreIgnoredAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		r := new(reporter)
		r.value.Store("TEXT application_utilization=0.5")
		f.net.Listen("a:80", r)
		var mu sync.Mutex
		var heard []policy.MalformedHeader
		obs := &policy.Observer{MalformedHeader: func(m policy.MalformedHeader) {
			mu.Lock()
			heard = append(heard, m)
			mu.Unlock()
		}}
		rt := newLaneTransport(t, f, Config{Observer: obs, Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static("a:80")}}})
		prime(t, rt, "http://api/")
		laneGet(t, rt, "http://api/", "")
		hostile := []string{
			"TEXT application_utilization=-1",
			"TEXT application_utilization=NaN",
			"TEXT application_utilization=1e308",
			"TEXT application_utilization=" + strings.Repeat("9", 1024),
			"TEXT application_utilization=0.1,application_utilization=0.1",
			"TEXT named_metrics.resilix_in_flight=1,named_metrics.resilix_limit=0",
			"cpu_utilization=0.1",
		}
		for _, v := range hostile {
			r.value.Store(v)
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != http.StatusOK {
				t.Fatalf("%q: %d, %v", v, code, err)
			}
		}
		r.value.Store("JSON {\"application_utilization\": 0.1}") // another form: unread, not malformed
		laneGet(t, rt, "http://api/", "")
		m := rt.Measured("api")
		if l := laneAt(t, m, "a:80"); !l.HasLoad || l.Load != 0.5 {
			t.Errorf("after hostile reports, the lane's load is %v (HasLoad %v), want the last good one, 0.5", l.Load, l.HasLoad)
		}
		if m.MalformedHeaders != uint64(len(hostile)) || len(heard) != len(hostile) {
			t.Fatalf("%d malformed headers counted, %d heard; want %d", m.MalformedHeaders, len(heard), len(hostile))
		}
		for _, h := range heard {
			if h.Header != orca.Header || h.Key != "api" || len(h.Value) > 64 {
				t.Errorf("heard %+v", h)
			}
		}
	})
}

// TestAnIdleReportIsBoundedByFailures: a server that says it is idle
// while the client sees its attempts fail is taken as at least at its
// limit, until a report comes after the failure.
func TestAnIdleReportIsBoundedByFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		r := new(reporter)
		r.value.Store("TEXT application_utilization=0")
		f.net.Listen("a:80", r)
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static("a:80")}}})
		prime(t, rt, "http://api/")
		laneGet(t, rt, "http://api/", "")
		if l := laneAt(t, rt.Measured("api"), "a:80"); l.Load != 0 {
			t.Fatalf("idle and answering: load %v", l.Load)
		}
		r.status.Store(http.StatusInternalServerError) // failing, and idle by its word
		laneGet(t, rt, "http://api/", "")
		if l := laneAt(t, rt.Measured("api"), "a:80"); l.Load != 1 {
			t.Errorf("idle by its word, failing by the client's: load %v, want 1", l.Load)
		}
		r.status.Store(0)
		time.Sleep(time.Second)
		laneGet(t, rt, "http://api/", "")
		if l := laneAt(t, rt.Measured("api"), "a:80"); l.Load != 0 {
			t.Errorf("answering again: load %v, want 0", l.Load)
		}
	})
}

// TestAttemptsAskForLoadReports: on a key that picks its lanes by load
// reports, an attempt that carries headers of its own (Propagate) asks
// for a report in TEXT, unless the request asks in a form of its own;
// with Propagate off, or LoadReportAge negative, it does not ask, and
// the caller's Header is never written.
func TestAttemptsAskForLoadReports(t *testing.T) {
	for _, tc := range []struct {
		name      string
		propagate bool
		age       time.Duration
		own       string // the request's own endpoint-load-metrics-format
		want      string
	}{
		{name: "propagated", propagate: true, want: "text"},
		{name: "propagated, asked in JSON", propagate: true, own: "json", want: "json"},
		{name: "not propagated", want: ""},
		{name: "reports off", propagate: true, age: -1, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				var got atomic.Value
				f.net.Listen("a:80", http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
					got.Store(r.Header.Get(orca.FormatHeader))
				}))
				rt := newLaneTransport(t, f, Config{Policies: policy.Set{
					Propagate: tc.propagate,
					Replicas:  &policy.Replicas{Endpoints: Static("a:80"), LoadReportAge: tc.age},
				}})
				prime(t, rt, "http://api/")
				req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
				if tc.own != "" {
					req.Header.Set(orca.FormatHeader, tc.own)
				}
				before := req.Header.Clone()
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if v, _ := got.Load().(string); v != tc.want {
					t.Errorf("the server was asked %q, want %q", v, tc.want)
				}
				if len(req.Header) != len(before) || req.Header.Get(orca.FormatHeader) != before.Get(orca.FormatHeader) {
					t.Errorf("the caller's Header was written: %v, was %v", req.Header, before)
				}
			})
		})
	}
}

// TestALaneReportingAQueueIsPickedLess: of four replicas that answer
// alike, the one whose reports say a queue of many times its limit gets
// few of the calls; with LoadReportAge negative, its share.
func TestALaneReportingAQueueIsPickedLess(t *testing.T) {
	for _, tc := range []struct {
		name     string
		age      time.Duration
		min, max int64 // of 400 calls
	}{
		{name: "picking by reports", max: 40},
		{name: "reports off", age: -1, min: 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				var hot atomic.Int64
				for _, addr := range four {
					f.net.Listen(addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						if addr == "d:80" {
							hot.Add(1)
							w.Header().Set("endpoint-load-metrics", string(orca.AppendText(nil, 100, 4, 4, 76)))
						} else {
							w.Header().Set("endpoint-load-metrics", string(orca.AppendText(nil, 100, 2, 4, 0)))
						}
						time.Sleep(time.Millisecond)
					}))
				}
				rt := newLaneTransport(t, f, Config{Policies: policy.Set{
					Replicas: &policy.Replicas{Endpoints: Static(four...), LoadReportAge: tc.age},
				}})
				prime(t, rt, "http://api/")
				for range 100 { // every lane answered, out of its slow start
					laneGet(t, rt, "http://api/", "")
				}
				time.Sleep(time.Second)
				hot.Store(0)
				for range 400 {
					laneGet(t, rt, "http://api/", "")
				}
				n := hot.Load()
				t.Logf("the replica reporting a queue got %d of 400 calls", n)
				if n < tc.min || tc.max > 0 && n > tc.max {
					t.Errorf("the replica reporting a queue of 19 limits got %d of 400 calls, want in [%d, %d] (0: unbounded)", n, tc.min, tc.max)
				}
			})
		})
	}
}

// TestAReportCountsTheRequestItAnswers: admission counts the request it
// answers among its requests in flight, and the lane reads its report
// once that request has left: three replicas answering in 10 ms whose
// reports say 4 in flight of a limit of 4 have room for the next call
// (three left, the answered one gone), and keep the calls from a fourth
// that answers in 12 ms; read as at the limit, each would take 12.5 ms
// (a quarter of a service time waiting), and the fourth would get them
// all.
func TestAReportCountsTheRequestItAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		var slow atomic.Int64
		for _, addr := range four {
			f.net.Listen(addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if addr == "d:80" {
					slow.Add(1)
					w.Header().Set("endpoint-load-metrics", string(orca.AppendText(nil, 100, 1, 4, 0)))
					time.Sleep(12 * time.Millisecond)
					return
				}
				w.Header().Set("endpoint-load-metrics", string(orca.AppendText(nil, 100, 4, 4, 0)))
				time.Sleep(10 * time.Millisecond)
			}))
		}
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: Static(four...)}}})
		prime(t, rt, "http://api/")
		for range 100 { // every lane answered, out of its slow start
			laneGet(t, rt, "http://api/", "")
		}
		time.Sleep(time.Second)
		slow.Store(0)
		for range 400 {
			laneGet(t, rt, "http://api/", "")
		}
		if n := slow.Load(); n > 40 {
			t.Errorf("the replica answering in 12 ms got %d of 400 calls, want at most 40", n)
		}
	})
}
