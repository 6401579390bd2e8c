package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startDemo starts the example on a free loopback port, closed when the
// test and its subtests are done.
func startDemo(t *testing.T) *demo {
	t.Helper()
	d, err := start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// TestScrape runs the example on a free loopback port, makes a few hundred
// calls, scrapes /metrics once, and checks the families and labels the
// exporter emits and the hedge win rate they give. (Whether a hedge wins
// is up to the machine's scheduler; that one is started, is not.)
func TestScrape(t *testing.T) {
	d := startDemo(t)
	const calls = 400
	n, err := d.traffic(context.Background(), d.upstream.URL, calls, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	if n != calls {
		t.Fatalf("made %d calls, want %d", n, calls)
	}

	text := scrape(t, d.metricsURL())
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing the scrape: %v\n%s", err, text)
	}

	for name, typ := range map[string]dto.MetricType{
		"resilix_calls_total":             dto.MetricType_COUNTER,
		"resilix_attempts_total":          dto.MetricType_COUNTER,
		"resilix_hedges_total":            dto.MetricType_COUNTER,
		"resilix_call_duration_seconds":   dto.MetricType_HISTOGRAM,
		"resilix_hedge_threshold_seconds": dto.MetricType_HISTOGRAM,
		"resilix_breaker_state":           dto.MetricType_GAUGE,
		"resilix_budget_balance":          dto.MetricType_GAUGE,
		"resilix_limiter_limit":           dto.MetricType_GAUGE,

		"resilix_hedge_threshold_current_seconds": dto.MetricType_GAUGE,
	} {
		f, ok := families[name]
		if !ok {
			t.Errorf("no family %s in the scrape", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), typ)
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["key"] != d.key {
				t.Errorf("%s: key=%q, want %q", name, labels["key"], d.key)
			}
			if labels["otel_scope_name"] != "github.com/resilix/resilix/otelmetrics" {
				t.Errorf("%s: otel_scope_name=%q", name, labels["otel_scope_name"])
			}
		}
	}
	// The lines a dashboard is built on, as the exporter writes them.
	for _, want := range []string{
		`resilix_hedges_total{key="` + d.key + `",otel_scope_name="github.com/resilix/resilix/otelmetrics",otel_scope_schema_url="",otel_scope_version="",outcome="started"}`,
		`resilix_call_duration_seconds_bucket{key="` + d.key + `",otel_scope_name="github.com/resilix/resilix/otelmetrics",otel_scope_schema_url="",otel_scope_version="",outcome="success",le="0.0025"}`,
		`# TYPE resilix_calls_total counter`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the scrape has no line starting %s", want)
		}
	}

	// The gauges follow the transport's snapshot: a series for each
	// policy the key runs, none for one it does not (no shared rate
	// limit here).
	m := d.rt.Measured(d.key)
	for family, runs := range map[string]bool{
		"resilix_breaker_state":  m.HasBreaker,
		"resilix_budget_balance": m.HasBudget,
		"resilix_limiter_limit":  m.HasLimiter,

		"resilix_rate_limit_store": m.RateLimitStore != 0,
	} {
		if _, ok := families[family]; ok != runs {
			t.Errorf("%s in the scrape: %v, but the key runs that policy: %v", family, ok, runs)
		}
	}
	if !m.HasBreaker || !m.HasLimiter || m.RateLimitStore != 0 {
		t.Errorf("Measured(%q) = %+v, want a breaker, a limiter and no shared rate limit", d.key, m)
	}

	// The calls add up, and the win rate is a rate.
	var total float64
	for _, m := range families["resilix_calls_total"].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != calls {
		t.Errorf("resilix_calls_total sums to %v, made %d calls", total, calls)
	}
	hedges := map[string]float64{}
	for _, m := range families["resilix_hedges_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				hedges[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	if hedges["started"] == 0 {
		t.Fatalf("no hedge started: %v", hedges)
	}
	if rate := hedges["won"] / hedges["started"]; !(rate >= 0 && rate <= 1) {
		t.Errorf("hedge win rate %v/%v = %v, not in [0, 1]", hedges["won"], hedges["started"], rate)
	}
	t.Logf("hedges %v", hedges)
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

// counted sums the counters of family in text, a scrape, whose labels
// include want, or the counts of its histograms.
func counted(t *testing.T, text, family string, want map[string]string) float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	var sum float64
	for _, m := range families[family].GetMetric() {
		n := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				n++
			}
		}
		if n == len(want) {
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}
