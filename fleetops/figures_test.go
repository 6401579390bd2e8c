package fleetops

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A record is one line a client writes: a call it made, or, for the
// resilix client, an attempt on a lane, a lane ejected or back, or its
// key's count of lanes changing.
type record struct {
	Type string `json:"type"` // "call", "attempt", "eject", "return", "lanes"
	// T is when the call or the attempt started, or when the event
	// happened, in Unix nanoseconds.
	T int64 `json:"t"`
	// Kind is a call's: "get", "post" (a plain POST) or "keyed" (a POST
	// with an Idempotency-Key).
	Kind string `json:"kind,omitempty"`
	// Replica is the address that answered a call (nginx's X-Replica) or
	// the IP of an attempt's or an ejection's lane.
	Replica string `json:"replica,omitempty"`
	Status  int    `json:"status,omitempty"`
	Err     string `json:"err,omitempty"`
	// Lat is a call's or an attempt's latency in nanoseconds.
	Lat int64 `json:"lat,omitempty"`
	// N is the count of lanes of a "lanes" record.
	N      int    `json:"n,omitempty"`
	Proto  string `json:"proto,omitempty"` // a call's response's
	Reason string `json:"reason,omitempty"`
}

func (r record) start() time.Time { return time.Unix(0, r.T) }

// end is when a call's or an attempt's answer or error arrived.
func (r record) end() time.Time { return time.Unix(0, r.T+r.Lat) }

func (r record) failed() bool { return r.Err != "" || r.Status != 200 }

func readRecords(r io.Reader) ([]record, error) {
	var out []record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("record %q: %w", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

func readRecordsFile(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRecords(f)
}

// of returns the records of type typ that start in [from, to).
func of(recs []record, typ string, from, to time.Time) []record {
	var out []record
	for _, r := range recs {
		if r.Type == typ && !r.start().Before(from) && r.start().Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// tally is a client's calls over a stretch of time.
type tally struct {
	calls  int
	failed map[string]int // by kind
	lats   []time.Duration
	// answers counts the successful calls by the replica that answered.
	answers map[string]int
	errs    map[string]int // by error class or status
}

func tallyCalls(calls []record) tally {
	tl := tally{failed: map[string]int{}, answers: map[string]int{}, errs: map[string]int{}}
	for _, c := range calls {
		tl.calls++
		tl.lats = append(tl.lats, time.Duration(c.Lat))
		if c.failed() {
			tl.failed[c.Kind]++
			tl.errs[cmp.Or(c.Err, "status "+strconv.Itoa(c.Status))]++
			continue
		}
		tl.answers[c.Replica]++
	}
	slices.Sort(tl.lats)
	return tl
}

func (tl tally) failures() int {
	n := 0
	for _, v := range tl.failed {
		n += v
	}
	return n
}

// share is the replica's share of the successful calls, in [0, 1].
func (tl tally) share(replica string) float64 {
	n := 0
	for _, v := range tl.answers {
		n += v
	}
	if n == 0 {
		return 0
	}
	return float64(tl.answers[replica]) / float64(n)
}

// quantile returns the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// firstAnswer returns how long after since the replica first answered a
// call started at since or later, and false if it never did.
func firstAnswer(recs []record, replica string, since time.Time) (time.Duration, bool) {
	var first time.Time
	for _, r := range recs {
		if r.Type != "call" || r.failed() || r.Replica != replica || r.start().Before(since) {
			continue
		}
		if first.IsZero() || r.end().Before(first) {
			first = r.end()
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return first.Sub(since), true
}

// errClass names a call's error for the tables: the few kinds a fleet's
// life produces, else the error's last words.
func errClass(msg string) string {
	for _, k := range []struct{ in, class string }{
		{"connection refused", "refused"},
		{"context deadline exceeded", "deadline"},
		{"Client.Timeout", "deadline"},
		{"connection reset", "reset"},
		{"server closed idle connection", "closed"},
		{"unexpected EOF", "eof"},
		{"EOF", "eof"},
		{"no such host", "dns"},
		{"server misbehaving", "dns"},
	} {
		if strings.Contains(msg, k.in) {
			return k.class
		}
	}
	if i := strings.Index(msg, "resilix: "); i >= 0 {
		msg = msg[i:]
		if j := strings.Index(msg, " ("); j >= 0 {
			msg = msg[:j]
		}
		return msg
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// An accessLine is one request in a replica's access log, written in the
// fleet log format (see nginxConf): "$msec $server_addr $request_method
// $status $request_time "$http_x_fleet_id" "$http_idempotency_key"".
type accessLine struct {
	At        time.Time
	Replica   string
	Method    string
	Status    int
	Took      time.Duration
	ID, Key   string // "" when the header was absent
	plainPOST bool
}

func parseAccessLine(s string) (accessLine, error) {
	f := strings.Fields(s)
	if len(f) != 7 {
		return accessLine{}, fmt.Errorf("access line %q: %d fields, want 7", s, len(f))
	}
	msec, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return accessLine{}, fmt.Errorf("access line %q: %w", s, err)
	}
	status, err := strconv.Atoi(f[3])
	if err != nil {
		return accessLine{}, fmt.Errorf("access line %q: %w", s, err)
	}
	took, err := strconv.ParseFloat(f[4], 64)
	if err != nil {
		return accessLine{}, fmt.Errorf("access line %q: %w", s, err)
	}
	unquote := func(v string) string {
		v = strings.Trim(v, `"`)
		if v == "-" {
			return ""
		}
		return v
	}
	l := accessLine{
		At:      time.UnixMilli(int64(msec*1000 + 0.5)),
		Replica: f[1],
		Method:  f[2],
		Status:  status,
		Took:    time.Duration(took * float64(time.Second)),
		ID:      unquote(f[5]),
		Key:     unquote(f[6]),
	}
	l.plainPOST = l.Method == "POST" && l.Key == ""
	return l, nil
}

// repeatedPlainPOSTs returns the ids of plain POSTs (no Idempotency-Key)
// that reached a server more than once, over every replica's log, each
// with its count, sorted by id.
func repeatedPlainPOSTs(lines []accessLine) []string {
	seen := map[string]int{}
	for _, l := range lines {
		if l.plainPOST && l.ID != "" {
			seen[l.ID]++
		}
	}
	var out []string
	for id, n := range seen {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	slices.Sort(out)
	return out
}

// openConns counts, in the text of /proc/net/tcp, the sockets whose inode
// is in inodes (a process's) and whose remote address is to's IP, by
// remote IP, leaving out sockets in TIME_WAIT or CLOSE (no longer
// connections the process holds).
func openConns(procNetTCP string, inodes map[string]bool, to map[netip.Addr]bool) map[netip.Addr]int {
	out := map[netip.Addr]int{}
	for line := range strings.Lines(procNetTCP) {
		f := strings.Fields(line)
		if len(f) < 10 || f[0] == "sl" {
			continue
		}
		if st := f[3]; st == "06" || st == "07" || st == "0A" { // TIME_WAIT, CLOSE, LISTEN
			continue
		}
		if !inodes[f[9]] {
			continue
		}
		ip, ok := hexIPv4(f[2])
		if ok && to[ip] {
			out[ip]++
		}
	}
	return out
}

// hexIPv4 reads the address of a /proc/net/tcp "0200007F:1F90" (the IP's
// bytes in the host's order, little-endian here).
func hexIPv4(s string) (netip.Addr, bool) {
	h, _, ok := strings.Cut(s, ":")
	if !ok || len(h) != 8 {
		return netip.Addr{}, false
	}
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}), true
}

// table is a scenario's figures: a fixed-width table, with notes under it.
type table struct {
	cols  []string
	rows  [][]string
	notes []string
}

func (tb *table) row(cells ...string) { tb.rows = append(tb.rows, cells) }

func (tb *table) note(format string, args ...any) {
	tb.notes = append(tb.notes, fmt.Sprintf(format, args...))
}

func (tb *table) String() string {
	width := make([]int, len(tb.cols))
	for _, r := range append([][]string{tb.cols}, tb.rows...) {
		for i, c := range r {
			if i < len(width) {
				width[i] = max(width[i], len(c))
			}
		}
	}
	var b strings.Builder
	for _, r := range append([][]string{tb.cols}, tb.rows...) {
		for i, c := range r {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], c)
			} else if i < len(width) {
				fmt.Fprintf(&b, "  %*s", width[i], c)
			}
		}
		b.WriteByte('\n')
	}
	for _, n := range tb.notes {
		b.WriteString(n)
		b.WriteByte('\n')
	}
	return b.String()
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}

func secs(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
}
