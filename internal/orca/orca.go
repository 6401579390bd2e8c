// Package orca reads and writes load reports in the TEXT form of ORCA's
// HTTP header, endpoint-load-metrics: admission writes its load on
// responses, and the transport reads what any server reports, per lane.
//
// ORCA (Open Request Cost Aggregation) is the load report of xDS: the
// message is xds.data.orca.v3.OrcaLoadReport
// (github.com/cncf/xds, xds/data/orca/v3/orca_load_report.proto), and its
// HTTP form is one header, endpoint-load-metrics, whose first word names
// the encoding: TEXT, JSON or BIN (the design document linked from
// envoyproxy/envoy#6614; Envoy's reader is source/common/orca/orca_parser.cc
// and its examples test/common/orca/orca_parser_test.cc). TEXT is the
// message flattened into comma-separated key-value pairs, a map's entries
// under "<map>.<key>":
//
//	endpoint-load-metrics: TEXT cpu_utilization=0.3, rps_fractional=10.0, named_metrics.foo=0.4
//
// Envoy accepts '=' or ':' between a key and its value, and rejects a
// whole report that holds an unknown top-level key, a key twice, or a
// negative, NaN or infinite value; so a writer puts what the message has
// no field for under named_metrics.
//
// What this package reads is bounded, and never trusted blindly: see
// ParseValue. Parsing allocates nothing.
package orca

import (
	"net/http"
	"strconv"
)

// Header is the response header a load report travels in, canonical.
const Header = "Endpoint-Load-Metrics"

// FormatHeader is the request header that asks a server for a report in a
// given form (endpoint-load-metrics-format: text): vLLM and Triton report
// only when asked.
const FormatHeader = "Endpoint-Load-Metrics-Format"

// The named metrics admission writes beside ORCA's standard fields, as
// named_metrics.<name>: what a picker needs beyond a utilization.
const (
	// MetricInFlight is the number of requests inside the handler, the
	// reporting one among them.
	MetricInFlight = "resilix_in_flight"
	// MetricLimit is the adaptive concurrency limit on them.
	MetricLimit = "resilix_limit"
	// MetricQueued is the number of requests waiting for a slot.
	MetricQueued = "resilix_queued"
)

// The named metrics vLLM writes (vllm/entrypoints/.../orca_metrics.py,
// from its Prometheus gauges vllm:kv_cache_usage_perc and
// vllm:num_requests_waiting).
const (
	// metricKVCache is the share of the KV cache in use, in [0, 1]
	// despite its name.
	metricKVCache = "kv_cache_usage_perc"
	// metricWaiting is the number of requests waiting to be scheduled.
	metricWaiting = "num_requests_waiting"
)

// The bounds on what is read. A report that breaks one is malformed.
const (
	// MaxLen is the longest header value read: admission's report is
	// about 130 bytes, vLLM's about 80. A longer one is not scanned.
	MaxLen = 512
	// maxNumber is the longest number read, in bytes.
	maxNumber = 24
	// maxUtilization bounds a utilization: ORCA lets one exceed 1 (above
	// a soft limit); a hundred times over is no measurement.
	maxUtilization = 100
	// maxCount bounds a count of requests (in flight, a limit, a queue):
	// admission's limit is at most policy.Limiter's MaxLimit, far below.
	maxCount = 1 << 20
	// maxRate bounds rps_fractional.
	maxRate = 1e9
)

// Fields is a set of the fields a Report holds.
type Fields uint16

const (
	FieldApplication Fields = 1 << iota // application_utilization
	FieldCPU                            // cpu_utilization
	FieldRPS                            // rps_fractional
	FieldInFlight                       // named_metrics.resilix_in_flight
	FieldLimit                          // named_metrics.resilix_limit
	FieldQueued                         // named_metrics.resilix_queued
	FieldKVCache                        // named_metrics.kv_cache_usage_perc (vLLM)
	FieldWaiting                        // named_metrics.num_requests_waiting (vLLM)
)

// Report is what a load report says, of the fields this package reads;
// a field is meaningful only when Has holds it.
type Report struct {
	Has                     Fields
	Application, CPU        float64 // utilizations, in [0, 100]
	RPS                     float64 // requests per second, in [0, 1e9]
	InFlight, Limit, Queued float64 // resilix's, in [0, 2^20]; Limit >= 1
	KVCache                 float64 // vLLM's, in [0, 100]
	Waiting                 float64 // vLLM's, in [0, 2^20]
}

// Source says which field a Report's Load comes from.
type Source uint8

const (
	SourceNone        Source = iota // no field to read a load from
	SourceResilix                   // (in flight + queued) / limit
	SourceApplication               // application_utilization
	SourceKVCache                   // vLLM's kv_cache_usage_perc
	SourceCPU                       // cpu_utilization
)

// Load returns the server's load as a utilization (1: at its limit), and
// the field it comes from: resilix's own named metrics where present,
// (in flight + queued) / limit, which goes above 1 as the queue fills;
// else application_utilization; else vLLM's KV cache share; else
// cpu_utilization. It is at most 100.
func (r Report) Load() (float64, Source) {
	const resilix = FieldInFlight | FieldLimit
	switch {
	case r.Has&resilix == resilix:
		q := 0.0
		if r.Has&FieldQueued != 0 {
			q = r.Queued
		}
		return min((r.InFlight+q)/r.Limit, maxUtilization), SourceResilix
	case r.Has&FieldApplication != 0:
		return r.Application, SourceApplication
	case r.Has&FieldKVCache != 0:
		return r.KVCache, SourceKVCache
	case r.Has&FieldCPU != 0:
		return r.CPU, SourceCPU
	}
	return 0, SourceNone
}

// Status is what ParseValue made of a header value.
type Status uint8

const (
	// Absent: no report in TEXT form, or one with no field this package
	// reads.
	Absent Status = iota
	// OK: a report with at least one field read.
	OK
	// Unread: a report in another form (JSON, BIN), which this package
	// does not read.
	Unread
	// Malformed: a value that breaks the format or a bound; nothing of it
	// is taken.
	Malformed
)

// Parse reads the first value of h's endpoint-load-metrics header, as
// ParseValue does. A nil h has no report.
func Parse(h http.Header) (Report, Status, string) {
	vs := h[Header]
	if len(vs) == 0 {
		return Report{}, Absent, ""
	}
	r, st := ParseValue(vs[0])
	return r, st, vs[0]
}

// ParseValue reads a header value in TEXT form: "TEXT " and then
// key=value or key:value pairs, separated by commas, with optional white
// space around each key, value and pair. It takes the fields of Fields
// and passes over every other key well formed, with its value unread, as
// other servers write fields and named metrics of their own. It is
// strict on what it reads: the whole report is Malformed, and nothing of
// it taken, when the value is longer than MaxLen, when a pair has no
// separator or an empty or ill-formed key, when a field read appears
// twice, or when a field read has a value that is not a plain decimal
// number of at most 24 bytes (no sign, NaN, infinity or hexadecimal;
// an exponent of at most two digits) or is outside its bound: a
// utilization above 100, a count above 2^20, a limit below 1, a rate
// above 1e9. A value that does not start with a form's word is
// Malformed; one in JSON or BIN form is Unread. It allocates nothing.
func ParseValue(v string) (Report, Status) {
	if len(v) > MaxLen {
		return Report{}, Malformed
	}
	v = trim(v)
	word := v
	for i := 0; i < len(v); i++ {
		if v[i] == ' ' || v[i] == '\t' {
			word, v = v[:i], v[i:]
			break
		}
	}
	switch word {
	case "TEXT":
		if len(word) == len(v) {
			v = ""
		}
	case "JSON", "BIN":
		return Report{}, Unread
	default:
		return Report{}, Malformed
	}
	var r Report
	for len(v) > 0 {
		pair := v
		if i := indexByte(v, ','); i >= 0 {
			pair, v = v[:i], v[i+1:]
		} else {
			v = ""
		}
		pair = trim(pair)
		if pair == "" {
			continue // an empty element of a list, as RFC 9110 §5.6.1 lets a reader ignore
		}
		sep := -1
		for i := 0; i < len(pair); i++ {
			if pair[i] == '=' || pair[i] == ':' {
				sep = i
				break
			}
		}
		if sep < 0 {
			return Report{}, Malformed
		}
		key, val := trim(pair[:sep]), trim(pair[sep+1:])
		if !validKey(key) {
			return Report{}, Malformed
		}
		f, bound := field(key)
		if f == 0 {
			continue
		}
		if r.Has&f != 0 {
			return Report{}, Malformed
		}
		x, ok := number(val)
		if !ok || x > bound || f == FieldLimit && x < 1 {
			return Report{}, Malformed
		}
		r.Has |= f
		switch f {
		case FieldApplication:
			r.Application = x
		case FieldCPU:
			r.CPU = x
		case FieldRPS:
			r.RPS = x
		case FieldInFlight:
			r.InFlight = x
		case FieldLimit:
			r.Limit = x
		case FieldQueued:
			r.Queued = x
		case FieldKVCache:
			r.KVCache = x
		case FieldWaiting:
			r.Waiting = x
		}
	}
	if r.Has == 0 {
		return Report{}, Absent
	}
	return r, OK
}

// field returns the field key names, and its bound; 0 for a key not read.
func field(key string) (Fields, float64) {
	const named = "named_metrics."
	switch key {
	case "application_utilization":
		return FieldApplication, maxUtilization
	case "cpu_utilization":
		return FieldCPU, maxUtilization
	case "rps_fractional":
		return FieldRPS, maxRate
	case named + MetricInFlight:
		return FieldInFlight, maxCount
	case named + MetricLimit:
		return FieldLimit, maxCount
	case named + MetricQueued:
		return FieldQueued, maxCount
	case named + metricKVCache:
		return FieldKVCache, maxUtilization
	case named + metricWaiting:
		return FieldWaiting, maxCount
	}
	return 0, 0
}

// validKey reports whether key is a field's name as the flattened message
// spells it: letters, digits, '_', '.' and '-', not empty, not ending in
// a '.' (a map's name with no key).
func validKey(key string) bool {
	if key == "" || key[len(key)-1] == '.' {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// number parses a plain decimal number: digits with at most one '.' and
// at least one digit, then optionally 'e' or 'E', a sign and one or two
// digits; at most maxNumber bytes. strconv.ParseFloat is called only on
// what passed, on which it cannot fail (so it allocates no error) and
// whose value is finite and not negative.
func number(s string) (float64, bool) {
	if s == "" || len(s) > maxNumber {
		return 0, false
	}
	i, digits := 0, 0
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		digits++
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
			digits++
		}
	}
	if digits == 0 {
		return 0, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
			exp++
		}
		if exp == 0 || exp > 2 {
			return 0, false
		}
	}
	if i != len(s) {
		return 0, false
	}
	x, err := strconv.ParseFloat(s, 64)
	return x, err == nil
}

// trim removes the optional white space (space, tab) around s.
func trim(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// AppendText appends admission's report, in TEXT form, to b: its
// utilization (in flight over the limit), its rate of requests, and
// its in-flight count, limit and queue as named metrics.
//
//	TEXT application_utilization=0.45,rps_fractional=310.5,named_metrics.resilix_in_flight=9,named_metrics.resilix_limit=20,named_metrics.resilix_queued=0
//
// limit must be at least 1; a count above 2^20 is written as 2^20, so
// that ParseValue reads what was written. A utilization is written with
// three decimals, a rate with one.
func AppendText(b []byte, rps float64, inFlight, limit, queued int) []byte {
	b = append(b, "TEXT application_utilization="...)
	b = strconv.AppendFloat(b, min(float64(inFlight)/float64(limit), maxUtilization), 'f', 3, 64)
	b = append(b, ",rps_fractional="...)
	b = strconv.AppendFloat(b, min(max(rps, 0), maxRate), 'f', 1, 64)
	b = append(b, ",named_metrics."+MetricInFlight+"="...)
	b = strconv.AppendInt(b, int64(min(inFlight, maxCount)), 10)
	b = append(b, ",named_metrics."+MetricLimit+"="...)
	b = strconv.AppendInt(b, int64(min(limit, maxCount)), 10)
	b = append(b, ",named_metrics."+MetricQueued+"="...)
	b = strconv.AppendInt(b, int64(min(queued, maxCount)), 10)
	return b
}
