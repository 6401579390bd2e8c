package admission_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
)

// TestOtelmetricsCountsTheServer: with otelmetrics' Observer in its
// Config, a server's refusals are counted in resilix.shed with readable
// gate names, its limit is a resilix.limiter.limit gauge and a priority
// it could not parse is in resilix.headers.malformed, all under the key
// Config.Name.
func TestOtelmetricsCountsTheServer(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := otelmetrics.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	entered, hold := make(chan struct{}), make(chan struct{})
	h, err := admission.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(entered)
			<-hold
		}
	}), admission.Config{
		Name: "search", Observer: obs, Trust: func(*http.Request) bool { return true },
		Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(path string, kv ...string) int {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, path, nil)
		for i := 0; i+1 < len(kv); i += 2 {
			r.Header.Set(kv[i], kv[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	serve("/", "Resilix-Timeout-Ms", "0", "Resilix-Priority", "bulk")
	serve("/", "Resilix-Priority", "nonsense")
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve("/hold")
	}()
	<-entered
	if code := serve("/", "Resilix-Priority", "degraded"); code != http.StatusServiceUnavailable {
		t.Errorf("at the limit: %d, want 503", code)
	}
	close(hold)
	<-done

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[name(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[name(m.Name, p.Attributes)] = p.Value
				}
			}
		}
	}
	want := map[string]int64{
		"resilix.shed{gate=deadline,key=search,priority=bulk}":      1,
		"resilix.shed{gate=admission,key=search,priority=degraded}": 1,
		"resilix.limiter.limit{key=search}":                         1,
		// The priority "nonsense", treated as absent.
		"resilix.headers.malformed{http.header=Resilix-Priority,key=search}": 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func name(metric string, set attribute.Set) string {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return metric + "{" + strings.Join(kv, ",") + "}"
}
