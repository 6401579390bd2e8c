package transport_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// fbTraceOn makes TestFleetPushback explain its failures in more notes:
// RESILIX_FLEET_PUSHBACK_TRACE set to anything.
var fbTraceOn bool

// fbMaxEjected is the clients' Replicas.MaxEjected: -1 (no ejections)
// with RESILIX_FLEET_PUSHBACK_EJECT=off, to tell what ejections do to the
// fleet.
var fbMaxEjected = func() float64 {
	if os.Getenv("RESILIX_FLEET_PUSHBACK_EJECT") == "off" {
		return -1
	}
	return 0
}()

// fbStretch multiplies the replicas' service times: 1, or
// RESILIX_FLEET_PUSHBACK_STRETCH (1.05, say), to run the in-memory fleet
// as a machine that stretches service times would.
var fbStretch = func() float64 {
	f := 1.0
	if v := os.Getenv("RESILIX_FLEET_PUSHBACK_STRETCH"); v != "" {
		if _, err := fmt.Sscan(v, &f); err != nil || !(f > 0) {
			panic("RESILIX_FLEET_PUSHBACK_STRETCH=" + v + ": want a positive number")
		}
	}
	return f
}()

// fbBucket is the width of the trace's time series.
const fbBucket = 500 * time.Millisecond

// fbTrace records, for TestFleetPushback's notes, how its calls failed and
// what each replica's admission limiter did. A nil *fbTrace records nothing.
type fbTrace struct {
	start time.Time
	lanes map[string]int // address to replica index

	mu       sync.Mutex
	failures map[string]int // failed calls by how they ended
	perTime  []int          // failed calls by fbBucket of their start
	// attempts by replica, then "first 503", "retry 200", ...
	attempts  []map[string]int
	ejections []string
	// answered by replica, per fbBucket of their answer: the sum of the
	// 200s' latencies, and their count
	answered [][][2]int64
	// the clients' transports, and by replica, per fbBucket, per lane
	// state: the sum of the clients in that state over the samples, and
	// the samples
	sources []policy.StateSource
	states  [][]fbStates
}

// fbStates is a replica's lane in the clients over one fbBucket: the sum,
// over the samples, of the clients whose lane was in each state, and the
// samples.
type fbStates struct {
	in      [policy.LaneEjected + 1]int
	samples int
}

func newFBTrace(start time.Time, addrs []string) *fbTrace {
	tr := &fbTrace{start: start, lanes: map[string]int{}, failures: map[string]int{}}
	for i, a := range addrs {
		tr.lanes[a] = i
		tr.attempts = append(tr.attempts, map[string]int{})
		tr.answered = append(tr.answered, nil)
		tr.states = append(tr.states, nil)
	}
	return tr
}

func (tr *fbTrace) observer() *policy.Observer {
	if tr == nil {
		return nil
	}
	return &policy.Observer{AttemptDone: tr.attempt, LaneEjected: tr.ejected, Attach: tr.attach}
}

func (tr *fbTrace) attach(s policy.StateSource) {
	tr.mu.Lock()
	tr.sources = append(tr.sources, s)
	tr.mu.Unlock()
}

// sample reads, every fbSample until ctx ends, the state of each client's
// lane of each replica. A nil *fbTrace reads nothing.
func (tr *fbTrace) sample(ctx context.Context) {
	if tr == nil {
		return
	}
	tick := time.NewTicker(fbSample)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			tr.mu.Lock()
			srcs := slices.Clone(tr.sources)
			tr.mu.Unlock()
			in := make([][policy.LaneEjected + 1]int, len(tr.states))
			for _, src := range srcs {
				src.States(func(_ string, s policy.Snapshot) {
					for _, ls := range s.PerLane {
						if i, ok := tr.lanes[ls.Addr]; ok && ls.State <= policy.LaneEjected {
							in[i][ls.State]++
						}
					}
				})
			}
			b := int(now.Sub(tr.start) / fbBucket)
			tr.mu.Lock()
			for i := range tr.states {
				for len(tr.states[i]) <= b {
					tr.states[i] = append(tr.states[i], fbStates{})
				}
				st := &tr.states[i][b]
				for k, n := range in[i] {
					st.in[k] += n
				}
				st.samples++
			}
			tr.mu.Unlock()
		}
	}
}

func (tr *fbTrace) ejected(e policy.LaneEjection) {
	i, ok := tr.lanes[e.Addr]
	if !ok {
		return
	}
	at := time.Since(tr.start).Truncate(100 * time.Millisecond)
	tr.mu.Lock()
	tr.ejections = append(tr.ejections, fmt.Sprintf("r%d at %v for %v (%v)", i+1, at, e.For, e.Reason))
	tr.mu.Unlock()
}

func (tr *fbTrace) attempt(a policy.AttemptInfo) {
	i, ok := tr.lanes[a.Lane]
	if !ok {
		return
	}
	what := fmt.Sprint(a.StatusCode)
	if a.Err != nil {
		what = fbErrClass(a.Err)
	}
	tr.mu.Lock()
	tr.attempts[i][a.Kind.String()+" "+what]++
	if a.StatusCode == http.StatusOK {
		b := int(time.Since(tr.start) / fbBucket)
		for len(tr.answered[i]) <= b {
			tr.answered[i] = append(tr.answered[i], [2]int64{})
		}
		tr.answered[i][b][0] += int64(a.Latency)
		tr.answered[i][b][1]++
	}
	tr.mu.Unlock()
}

// fbErrClass names an error in a few words.
func fbErrClass(err error) string {
	var rej *policy.RejectedError
	switch {
	case errors.As(err, &rej):
		return "refused by " + rej.Gate.String()
	case errors.Is(err, policy.ErrAttemptTimeout):
		return "attempt timeout"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	s := err.Error()
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

func (tr *fbTrace) call(began time.Time, ok bool, status int, err error, rep *transport.Report) {
	if tr == nil || ok {
		return
	}
	how := fmt.Sprintf("status %d, %d wire attempts, exhausted %v, skipped %v", status, rep.WireAttempts, rep.Exhausted, rep.Skipped)
	if err != nil {
		how = fmt.Sprintf("%s, %d wire attempts", fbErrClass(err), rep.WireAttempts)
	}
	if i, ok := tr.lanes[rep.Lane]; ok {
		how += fmt.Sprintf(", last on r%d", i+1)
	}
	b := int(began.Sub(tr.start) / fbBucket)
	tr.mu.Lock()
	tr.failures[how]++
	for len(tr.perTime) <= b {
		tr.perTime = append(tr.perTime, 0)
	}
	tr.perTime[b]++
	tr.mu.Unlock()
}

func (tr *fbTrace) notes(tb *figureTable, reps []*fbReplica) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(tr.failures)) {
		tb.note(fmt.Sprintf("failed: %5d  %s", tr.failures[k], k))
	}
	tb.note(fmt.Sprintf("failed calls by %v of their start: %v", fbBucket, tr.perTime))
	for i, m := range tr.attempts {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
		}
		tb.note(fmt.Sprintf("r%d attempts: %s", i+1, strings.Join(parts, ", ")))
		var lat strings.Builder
		for _, x := range tr.answered[i] {
			fmt.Fprintf(&lat, " %.0f", float64(x[0])/float64(max(x[1], 1))/1e6)
		}
		tb.note(fmt.Sprintf("r%d mean latency of a 200 in ms, by %v of its answer:%s", i+1, fbBucket, lat.String()))
	}
	tb.note(fmt.Sprintf("lanes ejected by the clients: %d %v", len(tr.ejections), tr.ejections))
	for i, bs := range tr.states {
		for _, st := range []policy.LaneState{policy.LaneDown, policy.LaneHeld, policy.LaneEjected, policy.LaneProbing} {
			var b strings.Builder
			for _, x := range bs {
				fmt.Fprintf(&b, " %.1f", float64(x.in[st])/float64(max(x.samples, 1)))
			}
			tb.note(fmt.Sprintf("r%d clients whose lane is %s, mean by %v:%s", i+1, st, fbBucket, b.String()))
		}
	}
	for i, r := range reps {
		r.traceNotes(tb, i)
	}
}

// fbLimitTrace is a replica's admission limiter as sampled.
type fbLimitTrace struct {
	src     policy.StateSource
	codes   map[int]int   // answers other than 200, by status
	limit   [][2]int      // per fbBucket: the sum of the limit's samples, and their count
	queued  [][2]int      // per fbBucket: the sum of queued's samples, and their count
	minimum int           // the lowest limit sampled
	waits   time.Duration // the sum of the Retry-After-Ms answered
}

func (r *fbReplica) traceSample(now time.Time) {
	lt := r.trace
	if lt == nil || lt.src == nil {
		return
	}
	var s policy.Snapshot
	lt.src.States(func(_ string, snap policy.Snapshot) { s = snap })
	b := int(now.Sub(r.start) / fbBucket)
	r.mu.Lock()
	for len(lt.limit) <= b {
		lt.limit = append(lt.limit, [2]int{})
		lt.queued = append(lt.queued, [2]int{})
	}
	lt.limit[b][0] += s.LimiterLimit
	lt.limit[b][1]++
	lt.queued[b][0] += s.LimiterQueued
	lt.queued[b][1]++
	if lt.minimum == 0 || s.LimiterLimit < lt.minimum {
		lt.minimum = s.LimiterLimit
	}
	r.mu.Unlock()
}

func (r *fbReplica) traceRefusal(code int, h http.Header) {
	lt := r.trace
	if lt == nil {
		return
	}
	var ms time.Duration
	if v := h.Get("Resilix-Retry-After-Ms"); v != "" {
		var n int
		fmt.Sscan(v, &n)
		ms = time.Duration(n) * time.Millisecond
	}
	r.mu.Lock()
	lt.codes[code]++
	lt.waits += ms
	r.mu.Unlock()
}

func (r *fbReplica) traceNotes(tb *figureTable, i int) {
	lt := r.trace
	if lt == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	mean := func(xs [][2]int) string {
		var b strings.Builder
		for _, x := range xs {
			fmt.Fprintf(&b, " %.0f", float64(x[0])/float64(max(x[1], 1)))
		}
		return b.String()
	}
	n := 0
	for _, c := range lt.codes {
		n += c
	}
	tb.note(fmt.Sprintf("r%d admission: answers other than 200 by status %v, their mean Resilix-Retry-After-Ms %.0fms, lowest limit %d; limit by %v:%s", i+1, lt.codes, float64(lt.waits)/float64(max(n, 1))/1e6, lt.minimum, fbBucket, mean(lt.limit)))
	tb.note(fmt.Sprintf("r%d admission: queued by %v:%s", i+1, fbBucket, mean(lt.queued)))
}
