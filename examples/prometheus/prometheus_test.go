package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// tool returns the path of the named binary of Debian's prometheus
// package. Where it is not in PATH the test is skipped, and fails instead
// when CI=true: CI installs the package (.ci/run).
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s is not in PATH: install Prometheus (Debian: apt-get install prometheus) to run this test", name)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestRules checks rules.yml and prometheus.yml with promtool and runs
// the rules' unit tests, rules_test.yml: input series and the expected
// alerts for each alert, and the recording rules' values (clamped, absent
// rather than NaN).
func TestRules(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "rules.yml"},
		{"check", "config", "prometheus.yml"},
		{"test", "rules", "rules_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// dashboard is what the tests read of dashboard.json.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			Query      any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// query is one PromQL query of the dashboard or the rules, and where it is.
type query struct {
	where, expr string
}

func readDashboard(t *testing.T) (dashboard, []query) {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				qs = append(qs, query{fmt.Sprintf("panel %q, target %s", p.Title, tg.RefID), tg.Expr})
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			qs = append(qs, query{"variable " + v.Name, v.Definition})
		}
	}
	return d, qs
}

// TestDashboardJSON checks dashboard.json's shape: it parses, has the key
// variable read from a label, and every panel but a row has queries, each
// naming a resilix metric. TestPrometheus checks the names against a real
// scrape and runs the queries.
func TestDashboardJSON(t *testing.T) {
	d, qs := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	var key bool
	for _, v := range d.Templating.List {
		if v.Name == "key" {
			key = v.Type == "query" && strings.HasPrefix(v.Definition, "label_values(") && strings.HasSuffix(v.Definition, ", key)")
		}
	}
	if !key {
		t.Errorf("no variable key of type query with label_values(..., key): %+v", d.Templating.List)
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share the id %d", other, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, q := range qs {
		if !strings.Contains(q.expr, `key=~"$key"`) && !strings.HasPrefix(q.where, "variable") {
			t.Errorf("%s does not select the key variable: %s", q.where, q.expr)
		}
		if len(metricNames(q.expr)) == 0 {
			t.Errorf("%s names no resilix metric: %s", q.where, q.expr)
		}
	}
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames returns the resilix metric names expr uses: the exporter's
// (resilix_...) and this directory's recording rules' (level:resilix_...:op).
func metricNames(expr string) []string {
	var names []string
	for _, id := range identifier.FindAllString(quoted.ReplaceAllString(expr, `""`), -1) {
		if strings.HasPrefix(id, "resilix_") || strings.Contains(id, ":resilix_") {
			names = append(names, id)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// rulesFile is what the tests read of rules.yml.
type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) (records []string, qs []query) {
	t.Helper()
	b, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f rulesFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("rules.yml: %v", err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records = append(records, r.Record)
			}
			qs = append(qs, query{"rule " + r.Record + r.Alert, r.Expr})
		}
	}
	return records, qs
}

// TestPrometheus runs a real Prometheus server that scrapes the example
// every second and evaluates rules.yml, while the example plays a short
// scenario (hedges, a Bulk flood that is shed, a 503 storm that opens the
// breaker, a rate-limited phase with pushback, skipped retries), and calls
// the fleet, whose bad replica picking avoids and ejects. Then it
// checks through Prometheus's HTTP API that the events happened, that
// every metric the dashboard's and the rules' queries name was scraped
// (or recorded), that every dashboard query gives numbers, that the
// recording rules are in range, and that every rule evaluates without
// error.
func TestPrometheus(t *testing.T) {
	bin := tool(t, "prometheus")
	records, ruleQueries := readRules(t)
	_, dashQueries := readDashboard(t)

	d := startDemo(t)
	api := startPrometheus(t, bin, d.listener.Addr().String())

	// Prometheus has scraped the example once before the scenario starts,
	// so that it scrapes every phase. That takes about 5s: Prometheus
	// applies its targets that long after it starts (its discovery manager
	// sends updates at most every 5s).
	api.await(t, "the first scrape", `up{job="resilix"} == 1`, 15*time.Second)
	// Each phase of the scenario runs for its time, and again (up to ten
	// times) until what it is there for has happened, as the example's
	// own scrape says: on a busy machine fewer calls are made in a
	// second, and a hedge may not win in the first.
	type want struct {
		family string
		labels map[string]string
	}
	for _, p := range []struct {
		s    scenario
		want []want
	}{
		{scenario{Steady: time.Second}, []want{
			{"resilix_hedges_total", map[string]string{"outcome": "won"}},
			{"resilix_hedges_total", map[string]string{"outcome": "suppressed"}},
		}},
		{scenario{Flood: time.Second}, []want{
			{"resilix_shed_total", map[string]string{"gate": "limiter", "priority": "bulk"}},
		}},
		{scenario{Storm: 2 * time.Second}, []want{
			{"resilix_shed_total", map[string]string{"gate": "breaker"}},
			{"resilix_calls_total", map[string]string{"outcome": "rejected"}},
			{"resilix_retries_skipped_total", map[string]string{"reason": "gate"}},
			{"resilix_retries_skipped_total", map[string]string{"reason": "retry_after"}},
			{"resilix_attempts_total", map[string]string{"kind": "retry"}},
		}},
		{scenario{Recover: time.Second}, nil},
		{scenario{Limited: time.Second}, []want{
			{"resilix_pushbacks_total", map[string]string{"http_response_status_code": "429"}},
			{"resilix_shed_total", map[string]string{"gate": "throttler"}}, // the pushback held Bulk back
		}},
		{scenario{Calm: time.Second}, nil},
	} {
		p.s.Rate = 200
		for try := 1; ; try++ {
			logf := func(format string, args ...any) {
				if len(args) == 2 && args[1] == time.Duration(0) {
					return // the phases not run
				}
				t.Logf(format, args...)
			}
			if err := d.play(t.Context(), p.s, logf); err != nil {
				t.Fatal(err)
			}
			text := scrape(t, d.metricsURL())
			var missing []string
			for _, w := range p.want {
				if counted(t, text, w.family, w.labels) == 0 {
					missing = append(missing, fmt.Sprint(w.family, w.labels))
				}
			}
			if len(missing) == 0 {
				break
			}
			if try == 10 {
				t.Fatalf("after %d runs of the phase, still no %v", try, missing)
			}
			t.Logf("run %d of the phase made no %v: again", try, missing)
		}
	}
	// The hedges' rates (the win rate, the threshold) need an increase
	// after Prometheus's first sample of their series: on a busy machine
	// every hedge may have come before it. Wait for the samples, then run
	// the steady phase until there are more hedges.
	hedges := []want{
		{"resilix_hedges_total", map[string]string{"outcome": "started"}},
		{"resilix_hedges_total", map[string]string{"outcome": "won"}},
		{"resilix_hedge_threshold_seconds", nil},
	}
	api.await(t, "a sample of the hedges won", `resilix_hedges_total{outcome="won"}`, 30*time.Second)
	api.await(t, "a sample of the hedge threshold", `resilix_hedge_threshold_seconds_count`, 30*time.Second)
	var seen []float64
	text := scrape(t, d.metricsURL())
	for _, w := range hedges {
		seen = append(seen, counted(t, text, w.family, w.labels))
	}
	for try := 1; ; try++ {
		if err := d.play(t.Context(), scenario{Steady: time.Second, Rate: 200}, nil); err != nil {
			t.Fatal(err)
		}
		text := scrape(t, d.metricsURL())
		more := true
		for i, w := range hedges {
			more = more && counted(t, text, w.family, w.labels) > seen[i]
		}
		if more {
			break
		}
		if try == 10 {
			t.Fatalf("after %d more runs of the steady phase, no more hedges started and won than %v", try, seen)
		}
	}
	end := time.Now()
	// Two scrapes after the last event, so that rate() has two samples
	// of every series, and a rule evaluation after them.
	after := strconv.FormatFloat(float64(end.Add(1500*time.Millisecond).UnixMilli())/1000, 'f', 3, 64)
	api.await(t, "two scrapes after the scenario", `timestamp(up{job="resilix"}) > `+after, 10*time.Second)
	api.awaitRules(t, end.Add(1500*time.Millisecond), 10*time.Second)

	// The scenario made the events happen.
	for _, q := range []string{
		`resilix_calls_total{outcome="rejected"}`,
		`resilix_shed_total{gate="breaker"}`,   // the breaker opened
		`resilix_shed_total{gate="throttler"}`, // pushback held Bulk and BestEffort back
		`resilix_shed_total{gate="limiter", priority="bulk"}`,
		`resilix_pushbacks_total{http_response_status_code="429"}`,
		`resilix_retries_skipped_total{reason="gate"}`,
		`resilix_retries_skipped_total{reason="retry_after"}`,
		`resilix_hedges_total{outcome="won"}`,
		`resilix_hedges_total{outcome="suppressed"}`,
		`resilix_attempts_total{kind="retry"}`,
		`resilix_lane_attempts_total{outcome="failure"}`, // the fleet's bad replica
		`resilix_lane_state`,
	} {
		if v := api.scalar(t, "sum("+q+")"); !(v > 0) {
			t.Errorf("sum(%s) = %v: the scenario did not make it happen", q, v)
		}
	}
	t.Logf("breaker state at most %v over the scenario",
		api.scalar(t, `max(max_over_time(resilix_breaker_state[1m]))`))
	// Picking keeps the fleet's bad replica, which answers every call 503,
	// to a small share of the fleet's attempts: a fair share is a third.
	bad := strings.TrimPrefix(d.fleet[fleetSize-1].URL, "http://")
	share := api.scalar(t, `sum(resilix_lane_attempts_total{lane="`+bad+`"}) / sum(resilix_lane_attempts_total{key="`+d.fleetKey+`"})`)
	if !(share < 0.15) {
		t.Errorf("the fleet's bad replica had %v of its attempts, want under 0.15", share)
	}
	t.Logf("the fleet's bad replica: %.3f of its attempts, state at most %v", share,
		api.scalar(t, `max(max_over_time(resilix_lane_state{lane="`+bad+`"}[1m]))`))

	// Every metric the queries name was scraped (or, for a recording
	// rule, recorded).
	names := api.names(t)
	for _, q := range append(slices.Clone(dashQueries), ruleQueries...) {
		for _, n := range metricNames(q.expr) {
			if !slices.Contains(names, n) {
				t.Errorf("%s: %s is not in Prometheus", q.where, n)
			}
		}
	}
	for _, r := range records {
		if !slices.Contains(names, r) {
			t.Errorf("recording rule %s recorded nothing", r)
		}
	}

	// Every dashboard query returns numbers.
	for _, q := range dashQueries {
		if strings.HasPrefix(q.where, "variable") {
			continue
		}
		// Both keys, the upstream and the fleet, as Grafana writes a
		// variable's values into a regexp matcher: escaped for the
		// regexp, then for the PromQL string.
		keys := "(" + regexp.QuoteMeta(d.key) + "|" + regexp.QuoteMeta(d.fleetKey) + ")"
		expr := strings.NewReplacer(
			"$key", strings.ReplaceAll(keys, `\`, `\\`),
			"$__rate_interval", "1m",
		).Replace(q.expr)
		// A series may be NaN where its rates are all zero in the window
		// (a quantile of an outcome that stopped happening), but not
		// every series, and none infinite.
		vs := api.vector(t, expr)
		finite := 0
		for _, v := range vs {
			switch {
			case math.IsInf(v.value, 0):
				t.Errorf("%s: %v for %v: %s", q.where, v.value, v.metric, expr)
			case math.IsNaN(v.value):
				t.Logf("%s: NaN for %v", q.where, v.metric)
			default:
				finite++
			}
		}
		if finite == 0 {
			t.Errorf("%s: no number in %d series: %s", q.where, len(vs), expr)
		}
	}

	// The recording rules, in range.
	for rule, max := range map[string]float64{
		"key:resilix_hedge_win:ratio_rate5m":                 1,
		"key:resilix_wire_calls_per_call:ratio_rate5m":       3, // Set.Attempts
		"key:resilix_extra_wire_calls_per_call:ratio_rate5m": 2,
	} {
		vs := api.vector(t, rule+`{key="`+d.key+`"}`)
		if len(vs) != 1 {
			t.Errorf("%s: %d series, want 1: %v", rule, len(vs), vs)
			continue
		}
		if v := vs[0].value; !(v >= 0 && v <= max) {
			t.Errorf("%s = %v, want a number in [0, %v]", rule, v, max)
		}
		t.Logf("%s = %.3f", rule, vs[0].value)
	}
}

// promAPI is a client of one Prometheus server's HTTP API.
type promAPI struct {
	base   string
	client *http.Client
}

// startPrometheus starts bin in a temporary directory, scraping target
// every second and evaluating rules.yml every second, on a free loopback
// port; it is killed when the test ends.
func startPrometheus(t *testing.T, bin, target string) *promAPI {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: resilix
    static_configs:
      - targets: [%q]
`, rules, target)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin,
		"--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Dir = dir
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	api := &promAPI{base: "http://" + addr, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})

	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := api.client.Get(api.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return api
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready on %s after 15s (%v)\n%s", addr, err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// lockedBuffer is a bytes.Buffer that the process's output and the test
// may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// get decodes the data of an API answer into v.
func (p *promAPI) get(t *testing.T, path string, params url.Values, v any) {
	t.Helper()
	resp, err := p.client.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("GET %s %v: %s: %v\n%s", path, params, resp.Status, err, b)
	}
	if r.Status != "success" {
		t.Fatalf("GET %s %v: %s", path, params, r.Error)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("GET %s %v: %v\n%s", path, params, err, r.Data)
	}
}

// sample is one element of an instant vector.
type sample struct {
	metric map[string]string
	value  float64
}

// vector evaluates expr now; it fails the test on an error, or a result
// that is not an instant vector.
func (p *promAPI) vector(t *testing.T, expr string) []sample {
	t.Helper()
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	p.get(t, "/api/v1/query", url.Values{"query": {expr}}, &data)
	if data.ResultType != "vector" {
		t.Fatalf("%s: result type %q, want vector", expr, data.ResultType)
	}
	var vs []sample
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%s: value %v: %v", expr, r.Value, err)
		}
		vs = append(vs, sample{r.Metric, v})
	}
	return vs
}

// scalar evaluates expr, which must give at most one series: its value,
// or NaN if none.
func (p *promAPI) scalar(t *testing.T, expr string) float64 {
	t.Helper()
	vs := p.vector(t, expr)
	switch len(vs) {
	case 0:
		return math.NaN()
	case 1:
		return vs[0].value
	}
	t.Fatalf("%s: %d series, want one", expr, len(vs))
	return 0
}

// await polls expr until it gives a series, for at most within.
func (p *promAPI) await(t *testing.T, what, expr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(p.vector(t, expr)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s gave nothing for %v", what, expr, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitRules waits until every rule has been evaluated after since, and
// fails the test for each rule whose last evaluation failed.
func (p *promAPI) awaitRules(t *testing.T, since time.Time, within time.Duration) {
	t.Helper()
	type rule struct {
		Name           string    `json:"name"`
		Health         string    `json:"health"`
		LastError      string    `json:"lastError"`
		LastEvaluation time.Time `json:"lastEvaluation"`
	}
	deadline := time.Now().Add(within)
	for {
		var data struct {
			Groups []struct {
				Rules []rule `json:"rules"`
			} `json:"groups"`
		}
		p.get(t, "/api/v1/rules", nil, &data)
		var rules []rule
		for _, g := range data.Groups {
			rules = append(rules, g.Rules...)
		}
		if len(rules) > 0 && !slices.ContainsFunc(rules, func(r rule) bool { return r.LastEvaluation.Before(since) }) {
			for _, r := range rules {
				if r.Health != "ok" || r.LastError != "" {
					t.Errorf("rule %s: health %q, %s", r.Name, r.Health, r.LastError)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rules not all evaluated after %v within %v: %+v", since, within, rules)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// names returns the metric names Prometheus holds.
func (p *promAPI) names(t *testing.T) []string {
	t.Helper()
	var names []string
	p.get(t, "/api/v1/label/__name__/values", nil, &names)
	return names
}
