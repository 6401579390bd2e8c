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
// window reports nothing once its rings are stale.
//
// Beside the window, three short rings hold the most recent samples, one per
// period of Window/32 (under a second at the default 30s window), in
// coarser buckets: 4 per octave, every pair of the window's buckets in one,
// so that none is wider than 25% of its lower bound. They let
// [LatencyWindow.Threshold] come down within seconds when the latency falls,
// instead of staying up until the window forgets (see Threshold). A window
// takes about 4.6 KB, allocated once by [NewLatencyWindow].
//
// A quantile is answered with the upper bound of the bucket holding the
// sample quantile (the smallest sample s such that at least ceil(q·n)
// samples are ≤ s): never below it, and at most 12.5% above it, or one
// linear bucket (1024 ns) above it in the linear region (25% and 2048 ns in
// the recent rings). Durations above MaxDuration are clamped into the top
// bucket and counted by [LatencyWindow.Clamped]; a quantile that lands there
// is reported as MaxDuration, which is then an underestimate.
//
// Most callers want [LatencyWindow.Record] on every completed call
// ([LatencyWindow.RecordFailure] for one that failed) and
// [LatencyWindow.Threshold] for the configured quantile, which is memoized
// for a period (Window/32) so that reading it costs one atomic load and a
// comparison.
//
// A nil *LatencyWindow records nothing and reports nothing, so a scope that
// neither hedges nor limits needs none. NewLatencyWindow is the only way to
// make a usable one. All methods are safe for concurrent use.
//
// Each bucket of a ring is a 32-bit counter: a bucket that receives more
// than 2^32-1 records in one slice (over 570 million a second in a single
// bucket at the default window) wraps around. Records that race with the
// clearing of a ring at the start of a slice or a period may be lost; see
// [LatencyWindow.Record].
type LatencyWindow struct {
	// clock counts periods; a slice is 1<<periodShift of them.
	clock         clock
	quantile      float64
	minimum       uint64
	recentMinimum uint64

	// memo is the configured quantile's answer: (period+1)<<8 | bucket,
	// written only once the window holds at least minimum samples.
	memo    atomic.Uint64
	clamped atomic.Uint64

	rings  [rings]latencyRing
	recent [recentRings]recentRing
}

// latencyRing is the histogram of one slice.
type latencyRing struct {
	stamp  stamp
	counts [numBuckets]atomic.Uint32
}

// recentRing is the coarse histogram of one period: its bucket i counts
// the window's buckets 2i and 2i+1.
type recentRing struct {
	stamp  stamp
	counts [recentBuckets]atomic.Uint32
}

// memoShift is where the period starts in LatencyWindow.memo.
const memoShift = 8

// periodShift sets the period, the unit of the memo and of the recent
// rings: a slice holds 1<<periodShift periods, 8, so a period is Window/32
// (under a second at the default 30s window). The memoized threshold is
// rescanned at most once a period: a slice-long memo would let a brownout
// run for up to 7.5s against the threshold of the calm before it, hedging
// nearly every call; a rescan costs a couple of microseconds, once per
// period.
const periodShift = 3

const (
	// recentRings is how many periods the recent rings hold: the current
	// one and the two before it. Read at the start of a period (the first
	// Threshold of a period rescans), they hold about two periods of
	// samples, under 2s at the default window. A fourth ring would take
	// the window past its allocation size class (see
	// TestLatencyWindowSize).
	recentRings = 3

	// recentBuckets is the number of buckets of a recent ring, one per
	// pair of the window's: 4 per octave.
	recentBuckets = numBuckets / 2

	// recentTail is how many samples the recent rings must expect above
	// the quantile before their answer is used: they must hold at least
	// recentTail/(1 − Quantile) samples, 200 for the p95, 1000 for the
	// p99. The sample p95 of 200 samples lies between the distribution's
	// p92 and p97.5 in 92% of draws, and below the p92 in 7% (binomial
	// tails of rank 190): an answer that comes down is rarely a chance low.
	recentTail = 10
)

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
		clock:         newClock(max(orDefaultWindow(cfg.Window)>>periodShift, 1), now),
		quantile:      q,
		minimum:       minimum,
		recentMinimum: max(minimum, recentMinimumFor(q)),
	}
}

// recentMinimumFor returns how many samples the recent rings need before
// their answer for quantile q is used: recentTail/(1 − q), rounded up; for
// a q of 1 or more, the largest uint64, which they never hold.
func recentMinimumFor(q float64) uint64 {
	if !(q < 1) {
		return math.MaxUint64
	}
	n := math.Ceil(recentTail / (1 - max(q, 0)))
	if !(n < math.MaxInt64) { // q so near 1
		return math.MaxUint64
	}
	return uint64(n)
}

// Record adds a latency d observed at now, to the window and to the
// recent rings. A d of zero or less is counted in the lowest bucket, a d of
// MaxDuration or more in the top one; both out of range cases (d < 0 and
// d ≥ MaxDuration) are also counted by Clamped.
//
// Record does not allocate: it computes the period and the bucket (no
// division, no floating point) and makes two atomic adds, one to the
// window's ring and one to the recent ring. The first Record of a slice
// (or of a period) also claims that slice's ring (or that period's) and
// clears it. Records of the same slice that run while the ring is being
// cleared are not held up, and those that land in a bucket before the
// clear reaches it are lost: a loss bounded by what the window receives
// during one clear of 200 counters, once per slice (and of 100, once per
// period).
func (w *LatencyWindow) Record(now time.Time, d time.Duration) {
	if w == nil {
		return
	}
	w.record(now, d, true)
}

// RecordFailure adds the latency d of a call that failed, observed at now.
// It counts in the window as Record's does; in the recent rings only if d
// is at least the threshold last answered (or none has been): a failure
// that came back sooner than calls are hedged at says nothing of how long
// an answer takes, and a burst of them (a dependency refusing every call at
// once) would otherwise pull Threshold down to its speed within seconds. A
// slower failure counts everywhere: it is as slow as it looks. A failure
// that has a latency but no answer, such as a timeout, is a lower bound,
// and counts the same way.
func (w *LatencyWindow) RecordFailure(now time.Time, d time.Duration) {
	if w == nil {
		return
	}
	m := w.memo.Load()
	w.record(now, d, m == 0 || d >= bucketUpper(int(m&(1<<memoShift-1))))
}

// record is Record, into the recent rings too if recent is set.
func (w *LatencyWindow) record(now time.Time, d time.Duration, recent bool) {
	i := bucketIndex(d)
	if uint64(d) >= topNanos {
		w.clamped.Add(1)
	}
	p := w.clock.epoch(now)
	e := p >> periodShift
	r := &w.rings[e%rings]
	if r.stamp.v.Load() != e+1 {
		if r.stamp.claim(e + 1) {
			clear32(r.counts[:])
			r.stamp.release(e + 1)
		}
	}
	r.counts[i].Add(1)
	if !recent {
		return
	}
	c := &w.recent[p%recentRings]
	if c.stamp.v.Load() != p+1 {
		if c.stamp.claim(p + 1) {
			clear32(c.counts[:])
			c.stamp.release(p + 1)
		}
	}
	c.counts[i>>1].Add(1)
}

// clear32 zeroes the counters of a ring its caller has claimed.
func clear32(counts []atomic.Uint32) {
	for i := range counts {
		counts[i].Store(0)
	}
}

// Threshold returns the configured quantile at now, and whether the window
// holds at least MinSamples samples. Without enough samples the duration
// is the estimate from the samples there are (zero if none) and should not
// be acted on.
//
// The answer is the window's quantile, or the recent rings' when they hold
// enough samples and answer lower: at least recentTail/(1 − Quantile), 200
// for the p95, and never fewer than MinSamples. So a threshold that a
// brownout raised comes back down within about three periods of the
// latency falling (under 3s at the default 30s window) on a host busy
// enough to fill the recent rings (about 110 calls a second or more for
// the p95 at the default window), instead of staying up until the window
// forgets; on a quieter host, or while the recent samples are slower than
// the window's, the answer is the window's alone. The rise is the
// window's: the recent samples can lower the answer, never raise it.
// Either way the answer is never below the sample quantile of the samples
// it was taken from (see [LatencyWindow.RecordFailure] for the failures
// the recent rings leave out).
//
// Once there are enough samples, the answer is memoized for the rest of
// the period, and reading it costs one epoch computation, one atomic load
// and a comparison. Below the minimum it is recomputed on every call, so
// that a window turns warm as soon as it has enough samples.
func (w *LatencyWindow) Threshold(now time.Time) (time.Duration, bool) {
	if w == nil {
		return 0, false
	}
	p := w.clock.epoch(now)
	if m := w.memo.Load(); m>>memoShift == p+1 {
		return bucketUpper(int(m & (1<<memoShift - 1))), true
	}
	return w.threshold(p)
}

// threshold is the slow path of Threshold: scan, and memoize an answer
// backed by enough samples.
func (w *LatencyWindow) threshold(p uint64) (time.Duration, bool) {
	var sum [numBuckets]uint64
	n := w.snapshot(p>>periodShift, &sum)
	if n == 0 {
		return 0, false
	}
	i := quantileBucket(sum[:], n, w.quantile)
	if n < w.minimum {
		return bucketUpper(i), false
	}
	var recent [recentBuckets]uint64
	if k := w.snapshotRecent(p, &recent); k >= w.recentMinimum {
		// Recent bucket j ends where the window's 2j+1 does.
		i = min(i, 2*quantileBucket(recent[:], k, w.quantile)+1)
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
// afresh, and whether the window holds at least MinSamples samples. It
// reads the window alone, not the recent rings: never below the sample
// quantile, at most 12.5% above it (or 1024 ns in the linear region).
func (w *LatencyWindow) Quantile(now time.Time, q float64) (time.Duration, bool) {
	if w == nil {
		return 0, false
	}
	var sum [numBuckets]uint64
	n := w.snapshot(w.clock.epoch(now)>>periodShift, &sum)
	if n == 0 {
		return 0, false
	}
	return bucketUpper(quantileBucket(sum[:], n, q)), n >= w.minimum
}

// Count returns how many samples the window holds at now.
func (w *LatencyWindow) Count(now time.Time) uint64 {
	if w == nil {
		return 0
	}
	var sum [numBuckets]uint64
	return w.snapshot(w.clock.epoch(now)>>periodShift, &sum)
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

// snapshotRecent adds into sum the counts of the recent rings at period p
// (those stamped with p, p-1 or p-2) and returns their total, as snapshot
// does for the window.
func (w *LatencyWindow) snapshotRecent(p uint64, sum *[recentBuckets]uint64) uint64 {
	var n uint64
	var part [recentBuckets]uint32
	for k := uint64(0); k < recentRings && k <= p; k++ {
		want := p - k + 1
		r := &w.recent[(p-k)%recentRings]
		if r.stamp.v.Load() != want {
			continue
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
func quantileBucket(sum []uint64, n uint64, q float64) int {
	rank := rankOf(q, n)
	var seen uint64
	for i, c := range sum {
		seen += c
		if seen >= rank {
			return i
		}
	}
	return len(sum) - 1
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
