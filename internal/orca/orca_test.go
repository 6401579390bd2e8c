package orca

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseExamples: the format's own examples, as its writers and Envoy's
// tests spell them, read as the fields they say.
func TestParseExamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want Report
	}{
		{
			// Triton's client guide, the TEXT example.
			"triton", "TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10.0, eps=1, named_metrics.custom_metric_util=0.4",
			Report{Has: FieldCPU | FieldRPS, CPU: 0.3, RPS: 10},
		},
		{
			// Envoy's orca_parser_test.cc, with '=' and with ':'.
			"envoy=", "TEXT cpu_utilization=0.7,application_utilization=0.8,mem_utilization=0.9,rps_fractional=1000,eps=2,named_metrics.foo=123,named_metrics.bar=0.2,utilization.total=0.5",
			Report{Has: FieldCPU | FieldApplication | FieldRPS, CPU: 0.7, Application: 0.8, RPS: 1000},
		},
		{
			"envoy:", "TEXT cpu_utilization:0.7,application_utilization:0.8,mem_utilization:0.9,rps_fractional:1000,eps:2,named_metrics.foo:123,named_metrics.bar:0.2,utilization.total:0.5",
			Report{Has: FieldCPU | FieldApplication | FieldRPS, CPU: 0.7, Application: 0.8, RPS: 1000},
		},
		{
			// vLLM's, as its create_orca_header writes it.
			"vllm", "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0",
			Report{Has: FieldKVCache | FieldWaiting, KVCache: 0.4, Waiting: 3},
		},
		{
			"admission", string(AppendText(nil, 310.5, 9, 20, 2)),
			Report{Has: FieldApplication | FieldRPS | FieldInFlight | FieldLimit | FieldQueued, Application: 0.45, RPS: 310.5, InFlight: 9, Limit: 20, Queued: 2},
		},
		{"white space and empty elements", "TEXT\t cpu_utilization = 0.5 ,, ,rps_fractional\t:\t2e1,", Report{Has: FieldCPU | FieldRPS, CPU: 0.5, RPS: 20}},
		{"forms of numbers", "TEXT cpu_utilization=.5,application_utilization=1.,rps_fractional=1E+2", Report{Has: FieldCPU | FieldApplication | FieldRPS, CPU: 0.5, Application: 1, RPS: 100}},
		{"above one: over a soft limit", "TEXT application_utilization=1.5", Report{Has: FieldApplication, Application: 1.5}},
	} {
		got, st := ParseValue(tc.in)
		if st != OK || got != tc.want {
			t.Errorf("%s: ParseValue(%q) = %+v, %v; want %+v, OK", tc.name, tc.in, got, st, tc.want)
		}
	}
}

// TestParseRejects: a value that breaks the format or a bound is
// Malformed, and nothing of it is taken; another form is Unread; nothing
// read is Absent.
func TestParseRejects(t *testing.T) {
	kilobyte := strings.Repeat("x", 1024)
	for _, tc := range []struct {
		in   string
		want Status
	}{
		{"", Malformed},
		{"TEXT", Absent},
		{"TEXT ", Absent},
		{"TEXT eps=2,mem_utilization=0.3,named_metrics.foo=1", Absent},
		{"JSON {\"cpu_utilization\": 0.3}", Unread},
		{"BIN CQAAAAAAAOA/", Unread},
		{"text cpu_utilization=0.3", Malformed},
		{"TEXTcpu_utilization=0.3", Malformed},
		{"cpu_utilization=0.3", Malformed},
		{"TEXT cpu_utilization=-0.3", Malformed},
		{"TEXT cpu_utilization=+0.3", Malformed},
		{"TEXT cpu_utilization=NaN", Malformed},
		{"TEXT cpu_utilization=nan", Malformed},
		{"TEXT cpu_utilization=Inf", Malformed},
		{"TEXT cpu_utilization=+Inf", Malformed},
		{"TEXT cpu_utilization=1e308", Malformed},
		{"TEXT cpu_utilization=1e-308", Malformed}, // three exponent digits
		{"TEXT cpu_utilization=1e99", Malformed},   // above 100
		{"TEXT cpu_utilization=100.5", Malformed},
		{"TEXT cpu_utilization=0x1p-2", Malformed},
		{"TEXT cpu_utilization=1_0", Malformed},
		{"TEXT cpu_utilization=\"0.7\"", Malformed},
		{"TEXT cpu_utilization=", Malformed},
		{"TEXT cpu_utilization=.", Malformed},
		{"TEXT cpu_utilization=1e", Malformed},
		{"TEXT cpu_utilization=0.7 0.8", Malformed},
		{"TEXT cpu_utilization=0." + strings.Repeat("1", 30), Malformed},
		{"TEXT cpu_utilization=" + kilobyte, Malformed},
		{"TEXT named_metrics.foo=" + kilobyte, Malformed}, // too long, though unread
		{"TEXT cpu_utilization=0.7,cpu_utilization=0.8", Malformed},
		{"TEXT cpu_utilization=0.7,cpu_utilization:0.7", Malformed},
		{"TEXT not-a-list-of-key-value-pairs", Malformed},
		{"TEXT =0.3", Malformed},
		{"TEXT named_metrics.=1", Malformed},
		{"TEXT cpu utilization=0.3", Malformed},
		{"TEXT cpu_utilization=0.3;rps_fractional=1", Malformed},
		{"TEXT named_metrics.resilix_limit=0", Malformed},
		{"TEXT named_metrics.resilix_limit=0.5", Malformed},
		{"TEXT named_metrics.resilix_in_flight=1048577", Malformed},
		{"TEXT named_metrics.resilix_queued=1e9", Malformed},
		{"TEXT rps_fractional=2e9", Malformed},
		{"TEXT named_metrics.kv_cache_usage_perc=101", Malformed},
		{"TEXT cpu_utilization=0.3,\x00=1", Malformed},
	} {
		got, st := ParseValue(tc.in)
		if st != tc.want || got != (Report{}) {
			t.Errorf("ParseValue(%.60q) = %+v, %v; want the zero Report, %v", tc.in, got, st, tc.want)
		}
	}
}

// TestLoad: a report's load comes from resilix's named metrics where
// present, else application_utilization, vLLM's KV cache, cpu_utilization.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		src  Source
	}{
		{string(AppendText(nil, 1, 20, 20, 10)), 1.5, SourceResilix},
		{"TEXT named_metrics.resilix_in_flight=5,named_metrics.resilix_limit=20,application_utilization=0.9", 0.25, SourceResilix},
		{"TEXT named_metrics.resilix_in_flight=5,application_utilization=0.9,cpu_utilization=0.1", 0.9, SourceApplication},
		{"TEXT cpu_utilization=0.1,named_metrics.kv_cache_usage_perc=0.7", 0.7, SourceKVCache},
		{"TEXT cpu_utilization=0.1,rps_fractional=5", 0.1, SourceCPU},
		{"TEXT rps_fractional=5", 0, SourceNone},
		{"TEXT named_metrics.resilix_in_flight=1048576,named_metrics.resilix_limit=1,named_metrics.resilix_queued=1048576", 100, SourceResilix},
	} {
		r, st := ParseValue(tc.in)
		if st != OK {
			t.Fatalf("ParseValue(%q) = %v", tc.in, st)
		}
		if got, src := r.Load(); got != tc.want || src != tc.src {
			t.Errorf("Load of %q = %v, %v; want %v, %v", tc.in, got, src, tc.want, tc.src)
		}
	}
}

// TestParseHeader: Parse reads the first value of the canonical header.
func TestParseHeader(t *testing.T) {
	if _, st, _ := Parse(nil); st != Absent {
		t.Errorf("Parse(nil) = %v", st)
	}
	h := http.Header{}
	h.Add("endpoint-load-metrics", "TEXT cpu_utilization=0.5")
	h.Add("endpoint-load-metrics", "TEXT cpu_utilization=-1")
	if r, st, v := Parse(h); st != OK || r.CPU != 0.5 || v != "TEXT cpu_utilization=0.5" {
		t.Errorf("Parse = %+v, %v, %q", r, st, v)
	}
}

// TestParseAllocatesNothing, whatever the value.
func TestParseAllocatesNothing(t *testing.T) {
	for _, v := range []string{
		string(AppendText(nil, 310.5, 9, 20, 2)),
		"TEXT cpu_utilization=1e308",
		"TEXT cpu_utilization=" + strings.Repeat("9", 400),
		"TEXT " + strings.Repeat("named_metrics.x=1,", 20),
	} {
		if n := testing.AllocsPerRun(100, func() { ParseValue(v) }); n != 0 {
			t.Errorf("ParseValue(%.40q) allocates %v times", v, n)
		}
	}
}

// FuzzParseValue: whatever a header holds, ParseValue does not panic, and
// what it takes is within its bounds; a report it takes is one it would
// take again as AppendText writes it back.
func FuzzParseValue(f *testing.F) {
	for _, s := range []string{
		"TEXT cpu_utilization=0.3, mem_utilization=0.8, rps_fractional=10.0, eps=1, named_metrics.custom_metric_util=0.4",
		"TEXT cpu_utilization:0.7,application_utilization:0.8,named_metrics.foo:123,utilization.total:0.5",
		"TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0",
		string(AppendText(nil, 310.5, 9, 20, 2)),
		"TEXT cpu_utilization=-1", "TEXT cpu_utilization=NaN", "TEXT cpu_utilization=1e308",
		"TEXT cpu_utilization=0.7,cpu_utilization=0.8", "JSON {}", "", "TEXT",
		"TEXT named_metrics.resilix_limit=0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, st := ParseValue(s)
		if st != OK {
			if r != (Report{}) {
				t.Fatalf("ParseValue(%q) = %+v with %v", s, r, st)
			}
			return
		}
		if r.Has == 0 {
			t.Fatalf("ParseValue(%q) OK with no field", s)
		}
		for _, x := range []float64{r.Application, r.CPU, r.RPS, r.InFlight, r.Limit, r.Queued, r.KVCache, r.Waiting} {
			if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) || x > maxRate {
				t.Fatalf("ParseValue(%q) = %+v: a value out of bounds", s, r)
			}
		}
		if r.Application > maxUtilization || r.CPU > maxUtilization || r.KVCache > maxUtilization ||
			r.InFlight > maxCount || r.Limit > maxCount || r.Queued > maxCount || r.Waiting > maxCount {
			t.Fatalf("ParseValue(%q) = %+v: a value above its bound", s, r)
		}
		if r.Has&FieldLimit != 0 && r.Limit < 1 {
			t.Fatalf("ParseValue(%q) = %+v: a limit below 1", s, r)
		}
		if l, _ := r.Load(); l < 0 || l > maxUtilization || math.IsNaN(l) {
			t.Fatalf("Load of %q = %v", s, l)
		}
	})
}

// TestAppendTextRoundTrips: what admission writes, ParseValue reads back.
func TestAppendTextRoundTrips(t *testing.T) {
	for _, c := range [][4]int{{0, 1, 0, 0}, {7, 20, 3, 0}, {1000, 1000, 500, 12345}, {maxCount + 5, 1, maxCount + 1, 0}} {
		v := string(AppendText(nil, float64(c[3])/10, c[0], c[1], c[2]))
		r, st := ParseValue(v)
		if st != OK || r.InFlight != float64(min(c[0], maxCount)) || r.Limit != float64(c[1]) || r.Queued != float64(min(c[2], maxCount)) {
			t.Errorf("%v: ParseValue(%q) = %+v, %v", c, v, r, st)
		}
		if want, _ := strconv.ParseFloat(strconv.FormatFloat(min(float64(c[0])/float64(c[1]), maxUtilization), 'f', 3, 64), 64); r.Application != want {
			t.Errorf("%v: application_utilization %v, want %v", c, r.Application, want)
		}
	}
}

// BenchmarkParse: reading admission's report, and a response without one.
func BenchmarkParse(b *testing.B) {
	h := http.Header{Header: {string(AppendText(nil, 310.5, 9, 20, 2))}, "Content-Type": {"text/plain"}}
	b.Run("report", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Parse(h)
		}
	})
	none := http.Header{"Content-Type": {"text/plain"}}
	b.Run("none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Parse(none)
		}
	})
}

// BenchmarkAppendText: writing admission's report.
func BenchmarkAppendText(b *testing.B) {
	var buf [160]byte
	b.ReportAllocs()
	for b.Loop() {
		AppendText(buf[:0], 310.5, 9, 20, 2)
	}
}
