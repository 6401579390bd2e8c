package transport

import (
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
)

// maxReportAge bounds the age of a lane's load report that counts: past
// it, the lane is judged by the client's own estimate alone. A server's
// load moves on the scale of its latency, and a lane that brought no
// report for that long (no answer, or answers without one) is better
// judged by what the client sees now.
const maxReportAge = 2 * time.Second

// laneLoad is the last load report a lane's server sent on an answer
// (ORCA's endpoint-load-metrics; see package orca), with the client's own
// evidence against it: when an attempt on the lane last failed. It is
// kept without a lock in a few words and read back whole (a sequence
// lock); a writer that finds another writing drops its own report, which
// is no fresher than the other's. It allocates nothing.
type laneLoad struct {
	epoch  time.Time     // the origin of at and failAt
	seq    atomic.Uint64 // odd while a report is being written
	load   atomic.Uint64 // float64 bits: orca.Report.Load
	src    atomic.Uint32 // orca.Source
	at     atomic.Int64  // when it came (see nanos); 0: never
	failAt atomic.Int64  // when an attempt on the lane last failed (see nanos); 0: never
}

// nanos returns now as l counts time: nanoseconds since one before its
// epoch, so that 0 is never (a clock read before the epoch is the epoch).
func (l *laneLoad) nanos(now time.Time) int64 { return max(int64(now.Sub(l.epoch)), 0) + 1 }

// store keeps a report of load from src that came at t.
func (l *laneLoad) store(load float64, src orca.Source, t int64) {
	s := l.seq.Load()
	if s&1 != 0 || !l.seq.CompareAndSwap(s, s+1) {
		return // another answer's report is being written
	}
	l.load.Store(math.Float64bits(load))
	l.src.Store(uint32(src))
	l.at.Store(t)
	l.seq.Store(s + 2)
}

// laneReport is a lane's load report as read at one instant.
type laneReport struct {
	load  float64     // bounded by the client's evidence (see read)
	src   orca.Source // SourceNone: no report ever
	age   time.Duration
	fresh bool // at most maxReportAge old: a picker may use it
}

// read returns the lane's last report at now. Its load is the server's
// word bounded by the client's own evidence: when an attempt on the lane
// failed at or after the report came (the attempt that brought it
// included), the load is at least 1, at the server's limit, however idle
// the server said it was, until a report comes after the failure. A
// report older than maxReportAge is not fresh. The zero laneReport is
// none.
func (l *laneLoad) read(now time.Time) laneReport {
	var r laneReport
	var at int64
	for range 4 { // a writer holds the words for a few stores
		s := l.seq.Load()
		if s&1 != 0 {
			continue
		}
		r.load = math.Float64frombits(l.load.Load())
		r.src = orca.Source(l.src.Load())
		at = l.at.Load()
		if l.seq.Load() == s {
			break
		}
		at = 0
	}
	if at == 0 {
		return laneReport{}
	}
	t := l.nanos(now)
	if l.failAt.Load() >= at {
		r.load = max(r.load, 1)
	}
	r.age = time.Duration(max(t-at, 0))
	r.fresh = r.age <= maxReportAge
	return r
}

// take reads the load report on resp, the answer of an attempt on the
// lane that ended at now with outcome o, and notes a failure as the
// client's own evidence against the lane's reports. A report in another
// form than TEXT, or with no load in it, is ignored; a malformed one is
// ignored, and its value returned with bad true, to be counted. It
// allocates nothing.
func (l *laneLoad) take(resp *http.Response, o policy.Outcome, now time.Time) (value string, bad bool) {
	t := l.nanos(now)
	if o == policy.Failure {
		l.failAt.Store(t)
	}
	if resp == nil {
		return "", false
	}
	r, st, v := orca.Parse(resp.Header)
	switch st {
	case orca.OK:
		if load, src := r.Load(); src != orca.SourceNone {
			l.store(load, src, t)
		}
	case orca.Malformed:
		return v, true
	}
	return "", false
}
