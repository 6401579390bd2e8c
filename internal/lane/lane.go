// Package lane is the runtime state of policy.Replicas: the lanes of one
// key, the picker, each lane's health and ejection, and the refresh of an
// Endpoints answer. It is a pure core: time is an input, and it starts no
// goroutine and no timer; the transport sends the wire attempts, asks the
// resolver and closes connections, as the answers of Set's methods tell it.
package lane

import (
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

// Lane is one connection pool of a key: an address of Endpoints, or one of
// Connections pools to the request's own address. Pool is what the caller
// sends through, built by the open func given to New. A lane is safe for
// concurrent use; its fields other than Pool are the Set's.
type Lane[P any] struct {
	// Addr is the lane's address, "" for a connection lane, and for the
	// lane that dials the request's own address until Endpoints answers.
	Addr string
	// Index is the lane's slot in its Set, in [0, policy.MaxLanes): the
	// bit of a used mask, and the name of a connection lane.
	Index int
	Pool  P
	// Redial is true while a connection lane placed anew (see Set) has
	// not succeeded since: the caller should close its pool's idle
	// connections before each of its attempts, so that it dials. Its
	// next success clears it.
	Redial atomic.Bool

	outstanding atomic.Int64  // attempts taken and not done
	est         atomic.Uint64 // float64 bits: the latency estimate, ns
	stamp       atomic.Int64  // when est was last sampled, ns since the Set's epoch
	until       atomic.Int64  // blocked (ejected, held or down) until then, ns; 0: never blocked
	pen         atomic.Uint64 // float64 bits: the failure penalty, ns, as of penT
	penT        atomic.Int64  // when pen was last set, ns
	warm        atomic.Int64  // when its slow start began, ns; 0: not in one

	// Its server's last load report (see Answer.Load), written by Done
	// with the Set's mu held and read by Take without it: a Take may read
	// words of two reports in a row, each of them sound.
	repLoad atomic.Uint64 // float64 bits: Load.Util
	repPer  atomic.Uint64 // float64 bits: Load.Per
	repLeft atomic.Uint64 // float64 bits: what of Load.Util left with the answer (Load.Served)
	repAt   atomic.Int64  // when it came, ns; 0: never
	repOut  atomic.Int64  // its attempts outstanding once it came
	failAt  atomic.Int64  // when an attempt on it last failed, ns; 0: never
	// When its last attempt ended with no answer (Silent or Mute), ns,
	// and the Set's count of ended attempts then; 0: one answered
	// since, or none ended so (see staleAfter).
	hushT atomic.Int64
	hushN atomic.Int64

	// Guarded by the Set's mu.
	health          health // what its outcomes have shown
	block           block  // what blocks it until until
	draining        bool   // its address left the set
	consecutive     int
	slow            int         // answers in a row far slower than the other lanes' (see latencyFactor)
	silentSlow      int         // of those, hedge losses with no answer (see silenceLocked)
	slowOuts        int         // the slow runs that took it out since its last fast answer (see slowLocked)
	outEnd          int64       // when that out ended, ns
	typ             float64     // its typical latency, ns (see typical)
	typT            int64       // when typ was last sampled, ns; 0: never
	lastS           int64       // when its last success was sent, ns; 0: never
	lastX           float64     // and its latency net of the key's stalls, ns
	endT            int64       // when its last attempt ended, ns
	calls, failures int         // in the current interval
	ejections       int         // the multiplier of the next ejection's time, less one
	last            Ejection[P] // the last ejection
	back            bool        // returned from it, and not yet reported
}

// Ejection is a lane ejected, or back from an ejection, for the caller to
// act on and report.
type Ejection[P any] struct {
	Lane   *Lane[P]
	Reason policy.EjectionReason
	For    time.Duration
}

// Counts is what Counts reports.
type Counts struct {
	Lanes    int // lanes picked from, those draining left out
	Ejected  int // of them, ejected now
	Ignored  int // addresses past policy.MaxLanes in Endpoints' last answer
	InFlight int // attempts taken and not done, on every lane, draining ones too
}
