package fleetops

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseAccessLine(t *testing.T) {
	got, err := parseAccessLine(`1796179868.533 127.0.0.2 POST 200 0.006 "r0-17" "-"` + "\n")
	if err != nil {
		t.Fatal(err)
	}
	want := accessLine{
		At: time.UnixMilli(1796179868533), Replica: "127.0.0.2", Method: "POST", Status: 200,
		Took: 6 * time.Millisecond, ID: "r0-17", plainPOST: true,
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(accessLine{})); diff != "" {
		t.Errorf("parseAccessLine (-want +got):\n%s", diff)
	}
	keyed, err := parseAccessLine(`1796179868.533 127.0.0.2 POST 200 0.006 "r0-18" "r0-18"`)
	if err != nil || keyed.plainPOST || keyed.Key != "r0-18" {
		t.Errorf("a keyed POST: %+v, %v; want Key r0-18, not plain", keyed, err)
	}
	for _, bad := range []string{"", "1 2 3", `x 127.0.0.2 GET 200 0.005 "-" "-"`, `1.0 127.0.0.2 GET ok 0.005 "-" "-"`} {
		if _, err := parseAccessLine(bad); err == nil {
			t.Errorf("parseAccessLine(%q): no error", bad)
		}
	}
}

func TestRepeatedPlainPOSTs(t *testing.T) {
	lines := []accessLine{
		{ID: "r0-1", Method: "POST", plainPOST: true},
		{ID: "r0-1", Method: "POST", plainPOST: true}, // sent twice
		{ID: "r0-2", Method: "POST", Key: "r0-2"},     // keyed: may repeat
		{ID: "r0-2", Method: "POST", Key: "r0-2"},
		{ID: "r0-3", Method: "GET"},
		{ID: "r0-3", Method: "GET"},
		{ID: "r0-4", Method: "POST", plainPOST: true},
	}
	if diff := cmp.Diff([]string{"r0-1×2"}, repeatedPlainPOSTs(lines)); diff != "" {
		t.Errorf("repeatedPlainPOSTs (-want +got):\n%s", diff)
	}
}

func TestOpenConns(t *testing.T) {
	// /proc/net/tcp: a connection to 127.0.0.5:8080 (ESTABLISHED, inode
	// 100), one to 127.0.0.6 in TIME_WAIT (inode 0), one to 127.0.0.5 of
	// another process (inode 300), one to 127.0.0.2 (inode 200).
	const tcp = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:C350 0500007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:C351 0600007F:1F90 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000
   2: 0100007F:C352 0500007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 300 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:C353 0200007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 200 1 0000000000000000 20 4 30 10 -1
`
	inodes := map[string]bool{"100": true, "200": true, "0": true}
	to := map[netip.Addr]bool{netip.MustParseAddr("127.0.0.5"): true, netip.MustParseAddr("127.0.0.6"): true}
	want := map[netip.Addr]int{netip.MustParseAddr("127.0.0.5"): 1}
	if diff := cmp.Diff(want, openConns(tcp, inodes, to), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("openConns (-want +got):\n%s", diff)
	}
}

func TestTally(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	recs := []record{
		{Type: "call", T: at(0), Kind: "get", Replica: "127.0.0.2", Status: 200, Lat: int64(5 * time.Millisecond)},
		{Type: "call", T: at(time.Second), Kind: "get", Replica: "127.0.0.3", Status: 200, Lat: int64(7 * time.Millisecond)},
		{Type: "call", T: at(2 * time.Second), Kind: "post", Err: "dial tcp 127.0.0.4:80: connect: connection refused", Lat: int64(time.Millisecond)},
		{Type: "call", T: at(3 * time.Second), Kind: "keyed", Replica: "127.0.0.2", Status: 503, Lat: int64(9 * time.Millisecond)},
		{Type: "attempt", T: at(time.Second), Replica: "127.0.0.4"},
		{Type: "call", T: at(10 * time.Second), Kind: "get", Replica: "127.0.0.4", Status: 200}, // outside
	}
	tl := tallyCalls(of(recs, "call", t0, t0.Add(10*time.Second)))
	if tl.calls != 4 || tl.failures() != 2 || tl.failed["post"] != 1 || tl.failed["keyed"] != 1 {
		t.Errorf("calls %d, failures %d (%v); want 4 calls, 1 post and 1 keyed failed", tl.calls, tl.failures(), tl.failed)
	}
	if got := tl.share("127.0.0.2"); got != 0.5 {
		t.Errorf("share of 127.0.0.2 = %v, want 0.5 (one of two successful calls)", got)
	}
	if got := quantile(tl.lats, 0.5); got != 5*time.Millisecond {
		t.Errorf("p50 = %v, want 5ms", got)
	}
	if got := quantile(tl.lats, 0.99); got != 9*time.Millisecond {
		t.Errorf("p99 = %v, want 9ms", got)
	}
	if got := countsText(tl.errs, errClass); got != "refused 1, status 503 1" {
		t.Errorf("errors %q, want refused 1, status 503 1", got)
	}
	two := map[string]int{`Get "http://x/": dial tcp 127.0.0.2:80: connect: connection refused`: 1, `Post "http://x/": dial tcp 127.0.0.3:80: connect: connection refused`: 2, "context deadline exceeded": 1}
	if got := countsText(two, errClass); got != "refused 3, deadline 1" {
		t.Errorf("errors %q, want refused 3, deadline 1 (by class)", got)
	}
	if d, ok := firstAnswer(recs, "127.0.0.3", t0.Add(500*time.Millisecond)); !ok || d != 507*time.Millisecond {
		t.Errorf("first answer of 127.0.0.3 = %v, %v; want 507ms", d, ok)
	}
	if _, ok := firstAnswer(recs, "127.0.0.3", t0.Add(2*time.Second)); ok {
		t.Errorf("127.0.0.3 answered after 2s; it did not")
	}
}

func TestQuantileEdges(t *testing.T) {
	if got := quantile(nil, 0.99); got != 0 {
		t.Errorf("quantile of nothing = %v, want 0", got)
	}
	lats := make([]time.Duration, 1000)
	for i := range lats {
		lats[i] = time.Duration(i+1) * time.Millisecond
	}
	for q, want := range map[float64]time.Duration{0.5: 500 * time.Millisecond, 0.99: 990 * time.Millisecond, 0.999: 999 * time.Millisecond, 1: time.Second} {
		if got := quantile(lats, q); got != want {
			t.Errorf("quantile(1..1000ms, %v) = %v, want %v", q, got, want)
		}
	}
}

func TestErrClass(t *testing.T) {
	for msg, want := range map[string]string{
		`Get "http://svc.fleet.test:3000/": dial tcp 127.0.0.2:3000: connect: connection refused`:                 "refused",
		`Post "http://svc.fleet.test:3000/": context deadline exceeded`:                                           "deadline",
		`Get "http://svc.fleet.test:3000/": read tcp 127.0.0.1:5->127.0.0.2:3000: read: connection reset by peer`: "reset",
		`Get "http://x/": resilix: circuit open (key "x", priority critical)`:                                     "resilix: circuit open",
		`Get "http://x/": something else`:                                                                         "something else",
	} {
		if got := errClass(msg); got != want {
			t.Errorf("errClass(%q) = %q, want %q", msg, got, want)
		}
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	var rec recorder
	want := []record{
		{Type: "call", T: 1, Kind: "get", Replica: "127.0.0.2", Status: 200, Lat: 5},
		{Type: "eject", T: 2, Replica: "127.0.0.3", Reason: "latency", Lat: int64(30 * time.Second)},
		{Type: "lanes", T: 3, N: 6},
	}
	for _, r := range want {
		rec.add(r)
	}
	path := t.TempDir() + "/r.jsonl"
	if err := rec.writeTo(path); err != nil {
		t.Fatal(err)
	}
	got, err := readRecordsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}
