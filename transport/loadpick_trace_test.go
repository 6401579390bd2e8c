package transport_test

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/internal/orca"
)

// lpTraceOn makes TestLoadPicking and TestLoadReports say where
// admission's refusals come from, in more notes: RESILIX_LOAD_PICKING_TRACE
// set to anything.
var lpTraceOn = os.Getenv("RESILIX_LOAD_PICKING_TRACE") != ""

const (
	// lpHerd is the span before a refusal in which the arrivals at its
	// replica are counted, and the clients they came from: a mean
	// service time, the time a slot takes to free.
	lpHerd = lpService
	// lpWarm is the start of a run counted as its first calls, before
	// every client has a report from every replica.
	lpWarm = 500 * time.Millisecond
	// lpAfterDip is how long after the dip's end a refusal counts as the
	// dip's: the time the queues it built take to drain.
	lpAfterDip = 500 * time.Millisecond
	// lpCycleBucket is the width of the refusals' histogram over the
	// dipping replica's period.
	lpCycleBucket = 500 * time.Millisecond
)

// lpSeen is a load report one replica sent one client: when, and what it
// said (see orca.Report.Load), less the request it answered, which it
// counts in flight.
type lpSeen struct {
	at        time.Time
	util, per float64
}

// lpArrival is a request that came to a replica.
type lpArrival struct {
	at     time.Time
	client int
}

// lpTrace records, in one run, the load reports each client was sent and
// the requests each replica got, to tell for each of admission's
// refusals what the refused client knew when it picked that replica. A
// nil *lpTrace records nothing.
type lpTrace struct {
	start time.Time

	mu       sync.Mutex
	seen     [lpClients][]lpSeen // by client, then replica
	arrivals [][]lpArrival       // by replica, the last lpHerd's
	tally    lpTally
}

// lpTally is what a trace counts, added up over runs.
type lpTally struct {
	refusals int
	// burst: refused in a burst, more requests having come to the
	// replica in lpHerd than its workers and queue hold (many clients
	// picking it at once, or, over loopback, a stalled machine's backlog
	// released at once); biggest: the most requests in such a span.
	burst, biggest int
	perRun         [][3]int       // each run's refusals, burst and biggest, in order
	cause          map[string]int // by what the client's own report from the replica said
	phase          map[string]int // by when in the run and the dip's period
	herd           map[string]int // by the clients that came to the replica in lpHerd before
	widened        int            // the client's least loaded replica by its reports, another said a queue
	cycle          []int          // by lpCycleBucket of lpPeriod
	replica        map[string]int // by replica and cause
}

func newLPTrace(start time.Time, replicas int) *lpTrace {
	tr := &lpTrace{start: start, arrivals: make([][]lpArrival, replicas)}
	for c := range tr.seen {
		tr.seen[c] = make([]lpSeen, replicas)
	}
	return tr
}

// lpClientPath is the path a client's calls go to, which names it to the
// replicas' trace.
func lpClientPath(client int) string { return "/c" + strconv.Itoa(client) }

// lpClientOf returns the client a request came from (see lpClientPath),
// -1 if none.
func lpClientOf(r *http.Request) int {
	c, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/c"))
	if err != nil || c < 0 || c >= lpClients {
		return -1
	}
	return c
}

// arrive records a request from client at replica rep, at now.
func (tr *lpTrace) arrive(rep, client int, now time.Time) {
	if tr == nil || client < 0 {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	a := append(tr.arrivals[rep], lpArrival{at: now, client: client})
	k := 0
	for k < len(a) && now.Sub(a[k].at) > lpHerd {
		k++
	}
	tr.arrivals[rep] = append(a[:0], a[k:]...)
}

// answer records the answer replica rep sent client at now, with its
// status and header: the load report in it, and, for a refusal, what
// the client knew when it picked rep.
func (tr *lpTrace) answer(rep, client int, now time.Time, status int, h http.Header) {
	if tr == nil || client < 0 {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		tr.refusal(rep, client, now)
	}
	if r, st, _ := orca.Parse(h); st == orca.OK {
		if u, src := r.Load(); src == orca.SourceResilix {
			if status == http.StatusOK {
				u -= 1 / r.Limit // the answered request, counted in flight, is done
			}
			tr.seen[client][rep] = lpSeen{at: now, util: u, per: 1 / r.Limit}
		}
	}
}

// util is what s, a report read at now, says the server's utilization
// is, the way a lane reads it (the queue drained at one limit a mean
// service time, down to the limit), and whether it is fresh.
func (s lpSeen) utilAt(now time.Time) (float64, bool) {
	if s.at.IsZero() || now.Sub(s.at) > 2*time.Second {
		return 0, false
	}
	return max(s.util-float64(now.Sub(s.at))/float64(lpService), min(s.util, 1)), true
}

// refusal tallies a refusal of client's request by replica rep at now.
// tr.mu is held.
func (tr *lpTrace) refusal(rep, client int, now time.Time) {
	t := &tr.tally
	t.init()
	t.refusals++
	if n := len(tr.arrivals[rep]); n > (1+lpQueue)*lpWorkers[rep] {
		t.burst++
		t.biggest = max(t.biggest, n)
	}
	seen := tr.seen[client]
	cause := "no fresh report from it"
	if u, ok := seen[rep].utilAt(now); ok {
		cause = "its report: room"
		if u+seen[rep].per > 1 {
			cause = "its report: a queue"
		}
	}
	t.cause[cause]++
	t.replica[fmt.Sprintf("%d %s", rep, cause)]++
	// Least loaded by the client's reports, while another said a queue:
	// where a widened pick would have sent it.
	least, queue := true, false
	if u, ok := seen[rep].utilAt(now); ok {
		for o := range seen {
			if uo, ok := seen[o].utilAt(now); ok && o != rep {
				least = least && u <= uo
				queue = queue || uo+seen[o].per > 1
			}
		}
		if least && queue {
			t.widened++
		}
	}
	since := now.Sub(tr.start)
	inPeriod := since % lpPeriod
	phase := "other"
	switch {
	case since < lpWarm:
		phase = "first calls"
	case inPeriod >= lpPeriod-lpDip:
		phase = "in the dip"
	case inPeriod < lpAfterDip && since >= lpPeriod:
		phase = "just after the dip"
	}
	t.phase[phase]++
	t.cycle[int(inPeriod/lpCycleBucket)]++
	clients := map[int]bool{}
	for _, a := range tr.arrivals[rep] {
		clients[a.client] = true
	}
	t.herd[fmt.Sprintf("from %d clients", len(clients))]++
}

func (t *lpTally) init() {
	if t.cause != nil {
		return
	}
	t.cause, t.phase, t.herd, t.replica = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	t.cycle = make([]int, lpPeriod/lpCycleBucket)
}

// add adds o's counts to t's.
func (t *lpTally) add(o lpTally) {
	t.perRun = append(t.perRun, o.perRun...)
	if o.refusals == 0 {
		return
	}
	t.init()
	t.refusals += o.refusals
	t.burst += o.burst
	t.biggest = max(t.biggest, o.biggest)
	t.widened += o.widened
	for _, m := range [][2]map[string]int{{t.cause, o.cause}, {t.phase, o.phase}, {t.herd, o.herd}, {t.replica, o.replica}} {
		for k, v := range m[1] {
			m[0][k] += v
		}
	}
	for i, v := range o.cycle {
		t.cycle[i] += v
	}
}

// notes adds t's counts to tb, for picker name.
func (t *lpTally) notes(tb *figureTable, name string) {
	if t.refusals == 0 {
		tb.note(fmt.Sprintf("trace, %s: no refusal", name))
		return
	}
	line := func(m map[string]int) string {
		keys := slices.Sorted(maps.Keys(m))
		slices.SortStableFunc(keys, func(a, b string) int { return m[b] - m[a] })
		var s []string
		for _, k := range keys {
			s = append(s, fmt.Sprintf("%s %d", k, m[k]))
		}
		return strings.Join(s, ", ")
	}
	tb.note(fmt.Sprintf("trace, %s: %d refusals, by the refused client's report from the replica (drained as a lane reads it): %s; %d of them in a burst (more requests came to the replica in the %v before than its workers and queue hold, at most %d)", name, t.refusals, line(t.cause), t.burst, lpHerd, t.biggest))
	var runs []string
	for _, r := range t.perRun {
		runs = append(runs, fmt.Sprintf("%d (%d in bursts, at most %d)", r[0], r[1], r[2]))
	}
	tb.note(fmt.Sprintf("trace, %s: each run's refusals: %s", name, strings.Join(runs, ", ")))
	tb.note(fmt.Sprintf("trace, %s: by replica and that report: %s", name, line(t.replica)))
	tb.note(fmt.Sprintf("trace, %s: the replica the least loaded by the client's fresh reports while another of them said a queue (a widened pick's): %d", name, t.widened))
	tb.note(fmt.Sprintf("trace, %s: by when: %s; by %v of the dipping replica's %v (its dip the last %v): %v", name, line(t.phase), lpCycleBucket, lpPeriod, lpDip, t.cycle))
	tb.note(fmt.Sprintf("trace, %s: the requests that came to the replica in the %v before, the refused one included, came: %s", name, lpHerd, line(t.herd)))
}

// lpTraced is a replica's answer to client, told to its trace as its
// headers go out.
type lpTraced struct {
	http.ResponseWriter
	tr          *lpTrace
	rep, client int
	told        bool
}

func (w *lpTraced) WriteHeader(code int) {
	w.tell(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *lpTraced) Write(b []byte) (int, error) {
	w.tell(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

func (w *lpTraced) tell(code int) {
	if !w.told && code >= 200 {
		w.told = true
		w.tr.answer(w.rep, w.client, time.Now(), code, w.Header())
	}
}
