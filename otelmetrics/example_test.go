package otelmetrics_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

func Example() {
	// Any MeterProvider will do; a ManualReader lets the example read
	// back what was recorded.
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())

	obs, err := otelmetrics.New(provider)
	if err != nil {
		panic(err)
	}
	rt, err := transport.New(transport.Config{
		Base:     httptestutil.NewUpstream(httptestutil.Options{}).RoundTripper(),
		Policies: policy.Set{Retry: &policy.Retry{}},
		Observer: obs,
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}
	for range 3 {
		resp, err := client.Get("http://api.example/")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, dp := range sum.DataPoints {
				lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
			}
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// resilix.attempts{key=api.example,kind=first,outcome=success} 3
	// resilix.calls{key=api.example,outcome=success} 3
}
