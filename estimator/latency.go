package estimator

import (
	"math"
	"sync/atomic"
	"time"
)

// LatencyConfig configures a [LatencyWindow]. The zero value is the
// recommended setting.
type LatencyConfig struct {
	// Window is how much history quantiles are taken over. It is kept as
	// four slices of Window/4; the oldest slice is dropped as a whole, so an
	// answer covers between 3/4 of Window and all of it. If zero or
	// negative, 30s is used.
	Window time.Duration

	// Quantile is the quantile Threshold answers, in (0, 1). If zero (or
	// not a number), 0.95 is used. A value at or below 0 answers the
	// smallest bucket recorded, a value at or above 1 the largest.
	Quantile float64

	// MinSamples is how many samples the window must hold before an
	// answer counts as evidence. If zero, 20 is used. If negative, one
	// sample is enough.
	MinSamples int
}

const (
	defaultQuantile       = 0.95
	defaultMinimumSamples = 20
)

// LatencyWindow is a sliding-window latency histogram that answers
// quantiles, for hedging thresholds and latency-driven limits.
//
// Durations are counted in log-linear buckets in the manner of
// HdrHistogram (https://hdrhistogram.github.io/HdrHistogram/): one bucket per
// 1024 ns below 8192 ns, then 8 buckets per octave up to [MaxDuration]
// (about 137.4 s), 200 buckets in all, so that no bucket above the linear
// region is wider than 12.5% of its lower bound. The window is four rings of
// those buckets, one per slice of Window/4, each stamped with the epoch it
// holds (see the package doc): no timer or goroutine ever runs, and an idle
// window reports nothing once its rings are stale. A window takes about
// 3.3 KB, allocated once by [NewLatencyWindow].
//
// A quantile is answered with the upper bound of the bucket holding the
// sample quantile (the smallest sample s such that at least ceil(q·n)
// samples are ≤ s): never below it, and at most 12.5% above it, or one
// linear bucket (1024 ns) above it in the linear region. Durations above
// MaxDuration are clamped into the top bucket and counted by
// [LatencyWindow.Clamped]; a quantile that lands there is reported as
// MaxDuration, which is then an underestimate.
//
// Most callers want [LatencyWindow.Record] on every completed call and
// [LatencyWindow.Threshold] for the configured quantile, which is memoized
// for an eighth of a slice so that reading it costs one atomic load and a
// comparison.
//
// A nil *LatencyWindow records nothing and reports nothing, so a scope that
// neither hedges nor limits needs none. NewLatencyWindow is the only way to
// make a usable one. All methods are safe for concurrent use.
//
// Each bucket of a ring is a 32-bit counter: a bucket that receives more
// than 2^32-1 records in one slice (over 570 million a second in a single
// bucket at the default window) wraps around. Records that race with the
// clearing of a ring at the start of a slice may be lost; see
// [LatencyWindow.Record].
type LatencyWindow struct {
	clock    clock
	quantile float64
	minimum  uint64

	// memo is the configured quantile's answer: (period+1)<<8 | bucket,
	// where period counts memoPeriods of memoClock, written only once the
	// window holds at least minimum samples.
	memoClock clock
	memo      atomic.Uint64
	clamped   atomic.Uint64

	rings [rings]latencyRing
}

// latencyRing is the histogram of one slice.
type latencyRing struct {
	stamp  stamp
	counts [numBuckets]atomic.Uint32
}

// memoShift is where the period starts in LatencyWindow.memo.
const memoShift = 8

// memoPeriods is how many memo periods a slice holds: the memoized
// threshold is rescanned at most every slice/memoPeriods (under a second at
// the default 30s window). A slice-long memo would let a brownout run for
// up to 7.5s against the threshold of the calm before it, hedging nearly
// every call; a rescan costs well under a microsecond, once per period.
const memoPeriods = 8

// NewLatencyWindow returns an empty window configured by cfg whose first
// slice starts at now.
func NewLatencyWindow(cfg LatencyConfig, now time.Time) *LatencyWindow {
	q := cfg.Quantile
	if q == 0 || math.IsNaN(q) {
		q = defaultQuantile
	}
	minimum := uint64(defaultMinimumSamples)
	switch {
	case cfg.MinSamples < 0:
		minimum = 1
	case cfg.MinSamples > 0:
		minimum = uint64(cfg.MinSamples)
	}
	return &LatencyWindow{
		clock:     newClock(cfg.Window, now),
		memoClock: newClock(orDefaultWindow(cfg.Window)/memoPeriods, now),
		quantile:  q,
		minimum:   minimum,
	}
}

// Record adds a latency d observed at now. A d of zero or less is counted
// in the lowest bucket, a d of MaxDuration or more in the top one; both out
// of range cases (d < 0 and d ≥ MaxDuration) are also counted by Clamped.
//
// Record does not allocate: it computes the epoch and the bucket (no
// division, no floating point) and makes one atomic add. The first Record of
// a slice also claims that slice's ring and clears it. Records of the same
// slice that run while the ring is being cleared are not held up, and those
// that land in a bucket before the clear reaches it are lost: a loss bounded
// by what the window receives during one clear of 200 counters, once per
// slice.
func (w *LatencyWindow) Record(now time.Time, d time.Duration) {
	if w == nil {
		return
	}
	i := bucketIndex(d)
	if uint64(d) >= topNanos {
		w.clamped.Add(1)
	}
	e := w.clock.epoch(now)
	r := &w.rings[e%rings]
	if r.stamp.v.Load() != e+1 {
		w.turn(r, e+1)
	}
	r.counts[i].Add(1)
}

// turn claims r for the epoch want-1 and clears it, unless it is already
// claimed (see stamp.claim).
func (w *LatencyWindow) turn(r *latencyRing, want uint64) {
	if !r.stamp.claim(want) {
		return
	}
	for i := range r.counts {
		r.counts[i].Store(0)
	}
	r.stamp.release(want)
}

// Threshold returns the configured quantile of the window at now, and
// whether the window holds at least MinSamples samples. Without enough
// samples the duration is the estimate from the samples there are (zero if
// none) and should not be acted on.
//
// Once there are enough samples, the answer is memoized for an eighth of a
// slice, and reading it costs one epoch computation, one atomic load and a
// comparison. Below the
// minimum it is recomputed on every call, so that a window turns warm as soon
// as it has enough samples.
func (w *LatencyWindow) Threshold(now time.Time) (time.Duration, bool) {
	if w == nil {
		return 0, false
	}
	p := w.memoClock.epoch(now)
	if m := w.memo.Load(); m>>memoShift == p+1 {
		return bucketUpper(int(m & (1<<memoShift - 1))), true
	}
	return w.threshold(w.clock.epoch(now), p)
}

// threshold is the slow path of Threshold: scan, and memoize an answer
// backed by enough samples.
func (w *LatencyWindow) threshold(e, p uint64) (time.Duration, bool) {
	var sum [numBuckets]uint64
	n := w.snapshot(e, &sum)
	if n == 0 {
		return 0, false
	}
	i := quantileBucket(&sum, n, w.quantile)
	if n < w.minimum {
		return bucketUpper(i), false
	}
	m := (p+1)<<memoShift | uint64(i)
	for {
		old := w.memo.Load()
		if old>>memoShift >= p+1 { // as new or newer than ours
			break
		}
		if w.memo.CompareAndSwap(old, m) {
			break
		}
	}
	return bucketUpper(i), true
}

// Quantile returns quantile q of the window at now, scanning the window
// afresh, and whether the window holds at least MinSamples samples. The
// answer is the same kind as Threshold's: never below the sample quantile,
// at most 12.5% above it (or 1024 ns in the linear region).
func (w *LatencyWindow) Quantile(now time.Time, q float64) (time.Duration, bool) {
	if w == nil {
		return 0, false
	}
	var sum [numBuckets]uint64
	n := w.snapshot(w.clock.epoch(now), &sum)
	if n == 0 {
		return 0, false
	}
	return bucketUpper(quantileBucket(&sum, n, q)), n >= w.minimum
}

// Count returns how many samples the window holds at now.
func (w *LatencyWindow) Count(now time.Time) uint64 {
	if w == nil {
		return 0
	}
	var sum [numBuckets]uint64
	return w.snapshot(w.clock.epoch(now), &sum)
}

// Clamped returns how many durations Record has clamped because they were
// negative or at least MaxDuration, over the life of the window.
func (w *LatencyWindow) Clamped() uint64 {
	if w == nil {
		return 0
	}
	return w.clamped.Load()
}

// snapshot adds into sum the counts of the rings in the window at epoch e
// (those stamped with e, e-1, e-2 or e-3) and returns their total. A ring
// claimed for a newer epoch while it is being read is left out.
func (w *LatencyWindow) snapshot(e uint64, sum *[numBuckets]uint64) uint64 {
	var n uint64
	var part [numBuckets]uint32
	for k := uint64(0); k < rings && k <= e; k++ {
		want := e - k + 1
		r := &w.rings[(e-k)%rings]
		if r.stamp.v.Load() != want {
			continue // stale, being cleared, or ahead of now
		}
		for i := range part {
			part[i] = r.counts[i].Load()
		}
		if r.stamp.v.Load() != want {
			continue
		}
		for i, c := range part {
			sum[i] += uint64(c)
			n += uint64(c)
		}
	}
	return n
}

// quantileBucket returns the bucket holding the sample of rank ceil(q·n)
// (clamped into [1, n]) among the n samples counted in sum.
func quantileBucket(sum *[numBuckets]uint64, n uint64, q float64) int {
	rank := rankOf(q, n)
	var seen uint64
	for i, c := range sum {
		seen += c
		if seen >= rank {
			return i
		}
	}
	return numBuckets - 1
}

// rankOf returns ceil(q·n) clamped into [1, n], for n ≥ 1. A q that is not a
// number counts as 0.
func rankOf(q float64, n uint64) uint64 {
	r := math.Ceil(q * float64(n))
	if !(r >= 1) {
		return 1
	}
	if r >= float64(n) {
		return n
	}
	return uint64(r)
}
