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
// Beside the window, three marks let [LatencyWindow.Threshold] tell the
// most recent samples apart, and follow the latency within seconds when it
// falls and within a few dozen calls when it rises, where the window alone
// lags it by a twentieth of what it holds (over a second at the default
// 30s) on the way up and stays up until it forgets on the way down (see
// Threshold). The first Threshold of each period of Window/32 (under a
// second at the default 30s window) copies the counts of the current
// slice's ring into a mark, in coarser buckets (4 per octave, every pair of
// the window's buckets in one, so that none is wider than 25% of its lower
// bound); the counts since a mark are that ring's now less the mark, and
// the next slice's ring if a slice began since. The marks cost the reader a
// copy once a period, and the writer nothing; a threshold the recent
// samples were read for costs each record above it one more atomic add, so
// that enough of them end it early. A window takes about 4.6 KB, allocated
// once by [NewLatencyWindow].
//
// A quantile is answered with the upper bound of the bucket holding the
// sample quantile (the smallest sample s such that at least ceil(q·n)
// samples are ≤ s): never below it, and at most 12.5% above it, or one
// linear bucket (1024 ns) above it in the linear region (25% and 2048 ns
// for the recent samples' answers). Durations above MaxDuration are clamped
// into the top bucket and counted by [LatencyWindow.Clamped]; a quantile
// that lands there is reported as MaxDuration, which is then an
// underestimate.
//
// Most callers want [LatencyWindow.Record] on every completed call
// ([LatencyWindow.RecordFailure] for one that failed) and
// [LatencyWindow.Threshold] for the configured quantile, which is memoized
// for a period (Window/32), or until enough records above it end it, so
// that reading it costs one atomic load and a comparison.
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
	// clock counts periods; a slice is 1<<periodShift of them.
	clock         clock
	quantile      float64
	minimum       uint64
	recentMinimum uint64

	// memo is the configured quantile's answer: (period+1)<<memoShift |
	// raised | watched | bucket, written only once the window holds at
	// least minimum samples; watched when the recent samples were read for
	// it, so that enough records above it end it before its period does,
	// and raised when they raised it above the window's. A watched memo
	// that risen ends keeps its bucket and raised alone, which no period
	// matches, for the next scan to hold a raised answer from.
	memo atomic.Uint64
	// risen counts the records above a watched memo's bucket since it was
	// taken (low 32 bits), against how many end it (high 32 bits).
	risen   atomic.Uint64
	clamped atomic.Uint64
	// fast counts the failures RecordFailure kept out of the recent
	// samples, over the life of the window.
	fast atomic.Uint64

	rings [rings]latencyRing
	marks [marks]mark
}

// latencyRing is the histogram of one slice.
type latencyRing struct {
	stamp  stamp
	counts [numBuckets]atomic.Uint32
}

// mark is the counts of the current slice's ring at the start of a period,
// coarse: its bucket i is the ring's buckets 2i and 2i+1.
type mark struct {
	// stamp is the period+1 of the mark, with busy while it is written; 0
	// for none.
	stamp atomic.Uint64
	// ring is the stamp of the ring copied (its slice+1), 0 if the copy
	// failed. A ring not yet claimed for the slice is copied as empty.
	ring   atomic.Uint64
	fast   atomic.Uint64 // LatencyWindow.fast when the mark was taken
	counts [recentBuckets]atomic.Uint32
}

// The fields of LatencyWindow.memo: the bucket in the low 8 bits, then
// the watched and raised flags, then the period+1 from memoShift.
const (
	memoBucket = 1<<8 - 1
	watched    = 1 << 8
	raised     = 1 << 9
	memoShift  = 10
)

// periodShift sets the period, the unit of the memo and of the marks: a
// slice holds 1<<periodShift periods, 8, so a period is Window/32 (under a
// second at the default 30s window). The memoized threshold is rescanned
// once a period, and sooner only when enough records above an answer the
// recent samples were read for end it (see LatencyWindow.Threshold): a
// slice-long memo would let a brownout run for up to 7.5s against the
// threshold of the calm before it, hedging nearly every call; a rescan
// costs a couple of microseconds.
const periodShift = 3

const (
	// marks is how many marks are kept: the current period's and the two
	// before it. The recent samples a fall is read from are those since the
	// mark of two periods before (or, missing that, of the period before):
	// read at the start of a period, about two periods of samples, under 2s
	// at the default window; a rise reads those since the latest mark with
	// enough samples after it. A fourth mark would take the window past its
	// allocation size class (see TestLatencyWindowSize).
	marks = 3

	// recentBuckets is the number of buckets of a mark, one per pair of
	// the window's: 4 per octave.
	recentBuckets = numBuckets / 2

	// recentTail is how many samples the recent samples must expect above
	// the quantile before their answer is used: they must hold at least
	// recentTail/(1 − Quantile) samples, 200 for the p95, 1000 for the
	// p99. The sample p95 of 200 samples lies between the distribution's
	// p92 and p97.5 in 92% of draws, and below the p92 in 7% (binomial
	// tails of rank 190): an answer that comes down is rarely a chance low.
	recentTail = 10

	// noiseZ is how many standard deviations of its own noise the recent
	// samples' quantile must be below the window's before it is used: the
	// answer is the bucket of their upper confidence bound (see
	// upperRankOf), and it is used only if that bucket is below the
	// window's; and above it, with their lower bound (lowerRankOf), on
	// the way up. At 1, the bound lies below the true quantile in about one
	// draw in six, and lowers the answer only when a bucket edge lies
	// between them too: on a steady bimodal host, 14 periods of 256 were
	// lowered, where the lower of the two point estimates was lowered in
	// 78 (TestLatencyWindowSteadyIsNotLowered). It is no more because the
	// recent samples are few: 470 at 250 calls a second, where a calm
	// whose slow tail is 3% of calls has that tail 2 standard deviations
	// (4.7 samples each) from the p95's 5%; at 2 the bound would land in
	// the tail about half the time, and a brownout's threshold would stay
	// up after it in as many periods. On the way up, the same bound raised
	// 6 of those 256 periods.
	noiseZ = 1
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

// recentMinimumFor returns how many recent samples are needed before
// their answer for quantile q is used: recentTail/(1 − q), rounded up; for
// a q of 1 or more, the largest uint64, never reached.
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

// Record adds a latency d observed at now. A d of zero or less is counted
// in the lowest bucket, a d of MaxDuration or more in the top one; both out
// of range cases (d < 0 and d ≥ MaxDuration) are also counted by Clamped.
//
// Record does not allocate: it computes the epoch and the bucket (no
// division, no floating point), makes one atomic add and loads the memoized
// threshold. A record above a threshold that the recent samples were read
// for (see Threshold) makes one more atomic add, and the one that ends
// that threshold early a compare-and-swap. The first Record of
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
	e := w.clock.epoch(now) >> periodShift
	r := &w.rings[e%rings]
	if r.stamp.v.Load() != e+1 {
		w.turn(r, e+1)
	}
	r.counts[i].Add(1)
	if m := w.memo.Load(); m&watched != 0 && uint64(i) > m&memoBucket {
		w.rise(m)
	}
}

// rise counts a record above the watched memo m, and ends m once as many
// have come as its answer had room for (see LatencyWindow.threshold).
func (w *LatencyWindow) rise(m uint64) {
	if v := w.risen.Add(1); uint32(v) >= uint32(v>>32) {
		w.memo.CompareAndSwap(m, m&(memoBucket|raised))
	}
}

// RecordFailure adds the latency d of a call that failed, observed at now.
// It counts in the window as Record's does. If d is below the threshold
// last answered, it is also counted (one more atomic add) as a failure
// that the recent samples leave out, so that their quantile is taken as if
// it had not been recorded: a failure that came back sooner than calls are
// hedged at says nothing of how long an answer takes, and a burst of them
// (a dependency refusing every call at once) would otherwise pull
// Threshold down to its speed within seconds. A slower failure counts
// everywhere: it is as slow as it looks. A failure that has a latency but
// no answer, such as a timeout, is a lower bound, and counts the same way.
func (w *LatencyWindow) RecordFailure(now time.Time, d time.Duration) {
	if w == nil {
		return
	}
	if m := w.memo.Load(); m != 0 && d < bucketUpper(int(m&memoBucket)) {
		w.fast.Add(1)
	}
	w.Record(now, d)
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

// Threshold returns the configured quantile at now, and whether the window
// holds at least MinSamples samples. Without enough samples the duration
// is the estimate from the samples there are (zero if none) and should not
// be acted on.
//
// The answer is the window's quantile, moved by the recent samples when
// there are enough of them, at least 10/(1 − Quantile) (200 for the p95)
// and never fewer than MinSamples, and they say, by more than their own
// noise, that the latency has moved:
//
//   - Down, from the samples since the mark of two periods before: when the
//     bucket of an upper confidence bound on their quantile (one standard
//     deviation of its rank above it) is below the window's bucket, the
//     answer is that bucket. The lower of two estimates of one quantile
//     would be biased low, and would hedge more than 1 − Quantile of calls;
//     a bound that must fall below the window's bucket does so by chance
//     rarely. So a threshold that a brownout raised comes back down within
//     about three periods of the latency falling (under 3s at the default
//     30s window), instead of staying up until the window forgets.
//   - Up, from the samples since the latest mark they are enough since
//     (this period's, the one before, or two before): when the bucket of a
//     lower confidence bound on their quantile (one standard deviation
//     below) lies wholly above the window's bucket, the answer is the end
//     of that bucket, and it holds while the bound stays in it (the window
//     catching up to the bucket's lower half is no sign that the latency
//     came down). The window's quantile lags a rising latency by a
//     twentieth of what the window holds, over a second at the default
//     window, and every call in between would be hedged: against a latency
//     that rises 1ms a second, or a quarter every 2s, the window alone
//     leaves half or more of the calls above its answer. A raise may read
//     fewer samples than a fall because an answer too high errs toward
//     hedging less; with fewer samples, a few dozen calls at a new latency
//     move their quantile.
//
// On a quieter host (about 110 calls a second or fewer for the p95 at the
// default window), or while the recent samples do not clearly differ from
// the window's, the answer is the window's alone. A lowered answer is never
// below the sample quantile of the samples it was taken from (see
// [LatencyWindow.RecordFailure] for the failures the recent samples leave
// out), and a raised one never above the end of the recent bucket holding
// their sample quantile (at most 25% above it). The recent samples need the
// marks that Threshold takes: on a window read less than once a period, the
// answer is the window's.
//
// Once there are enough samples, the answer is memoized for the rest of
// the period, and reading it costs one epoch computation, one atomic load
// and a comparison. Below the minimum it is recomputed on every call, so
// that a window turns warm as soon as it has enough samples. An answer the
// recent samples were read for ends sooner if the latency rises: Record
// counts the records above it, and the record that makes them as many as
// could still leave the recent samples' bound in its bucket ends the memo,
// so that the next Threshold scans again. A step up in latency is hedged
// for a few dozen calls, not for the rest of the period.
func (w *LatencyWindow) Threshold(now time.Time) (time.Duration, bool) {
	if w == nil {
		return 0, false
	}
	p := w.clock.epoch(now)
	if m := w.memo.Load(); m>>memoShift == p+1 {
		return bucketUpper(int(m & memoBucket)), true
	}
	return w.threshold(p)
}

// threshold is the slow path of Threshold: scan, and memoize an answer
// backed by enough samples, with, for a watched one, how many records
// above it can end it.
func (w *LatencyWindow) threshold(p uint64) (time.Duration, bool) {
	var (
		sum    [numBuckets]uint64
		newest newestRings
	)
	n := w.snapshot(p>>periodShift, &sum)
	if n == 0 {
		return 0, false
	}
	i := quantileBucket(sum[:], n, w.quantile)
	if n < w.minimum {
		return bucketUpper(i), false
	}
	marked := w.takeMark(p)
	prev := w.memo.Load()
	var (
		spans  [2][recentBuckets]uint64 // for a fall, and for a rise
		recent = &spans[0]
		flag   uint64
		room   uint64 // records above the answer before it may move
	)
	k, fast, ok := w.sinceMark(p, 2, &newest, recent)
	if !ok {
		k, fast, ok = w.sinceMark(p, 1, &newest, recent)
	}
	enough := ok && k-fast >= w.recentMinimum
	if enough {
		// Ranked as if the fast failures, all below the answer but for
		// those that raced with the mark, had not been recorded (see
		// RecordFailure): never below the quantile of the others. A
		// recent bucket j ends where the window's 2j+1 does.
		rank := upperRankOf(w.quantile, k-fast) + fast
		if j := bucketOfRank(recent[:], rank); 2*j+1 < i {
			// Each record raises the bound's rank by one at most, and
			// only a record above the answer does not raise held too:
			// the bound stays in bucket j until more records above it
			// have come than held exceeds rank by.
			i, flag = 2*j+1, watched
			room = heldTo(recent[:], j) - rank + 1
		}
	}
	if enough && flag == 0 {
		// The rise reads the samples since the latest mark that they
		// are enough since: this period's (unless this scan just took
		// it), the one before, or those above. Fewer samples need fewer
		// records of a new latency to move their quantile.
		latest := &spans[1]
		for back := uint64(0); back < 2; back++ {
			if back == 0 && marked {
				continue
			}
			if k1, fast1, ok1 := w.sinceMark(p, back, &newest, latest); ok1 && k1-fast1 >= w.recentMinimum {
				k, fast, recent = k1, fast1, latest
				break
			}
		}
		// A lower bound now, ranked as above. It raises the answer
		// to the end of its recent bucket j when j lies wholly above
		// the window's bucket i (recent bucket i/2 holds i), and
		// holds a raised answer while it stays in that answer's
		// bucket: the window catching up to the lower half of j is
		// no evidence that the latency came back down. While the
		// bound stays in bucket c, the answer holds; as above, that
		// is for held less rank records above it, and one more may
		// move it.
		rank := lowerRankOf(w.quantile, k-fast) + fast
		c := i / 2
		flag = watched
		j := bucketOfRank(recent[:], rank)
		if j > c || j == c && 2*j+1 > i && prev&(raised|memoBucket) == raised|uint64(2*j+1) {
			i, c, flag = 2*j+1, j, watched|raised
		}
		room = heldTo(recent[:], c) - rank + 1
	}
	if flag != 0 {
		w.risen.Store(min(room, math.MaxUint32) << 32)
	}
	m := (p+1)<<memoShift | flag | uint64(i)
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

// heldTo returns how many samples sum counts in its buckets 0 to j.
func heldTo(sum []uint64, j int) uint64 {
	var held uint64
	for _, c := range sum[:j+1] {
		held += c
	}
	return held
}

// Quantile returns quantile q of the window at now, scanning the window
// afresh, and whether the window holds at least MinSamples samples. It
// reads the window alone, not the recent samples: never below the sample
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

// takeMark takes the mark of period p, unless it is taken or being taken:
// the counts, coarse, of the ring of p's slice (zero if the ring is not yet
// claimed for it: it is cleared when it is). It reports whether it took it.
func (w *LatencyWindow) takeMark(p uint64) bool {
	mk := &w.marks[p%marks]
	v := mk.stamp.Load()
	if v&busy != 0 || v >= p+1 || !mk.stamp.CompareAndSwap(v, (p+1)|busy) {
		return false
	}
	e := p >> periodShift
	r := &w.rings[e%rings]
	mk.fast.Store(w.fast.Load())
	held := r.stamp.v.Load() == e+1
	for j := range mk.counts {
		var c uint32
		if held {
			c = r.counts[2*j].Load() + r.counts[2*j+1].Load()
		}
		mk.counts[j].Store(c)
	}
	ring := e + 1
	if held && r.stamp.v.Load() != e+1 {
		ring = 0 // turned over while copied: a now far behind other callers'
	}
	mk.ring.Store(ring)
	mk.stamp.Store(p + 1)
	return true
}

// newestRings is the rings of the two newest slices at an epoch e, coarse,
// as the first sinceMark of a scan that needs each reads it, so that the
// next reads the same: counts[k] is slice e-k's if held[k], once read[k].
type newestRings struct {
	counts [2][recentBuckets]uint64
	read   [2]bool
	held   [2]bool
}

// ring returns whether the ring of slice e-k holds that slice, reading it
// into counts[k] first if it is not read yet. A ring not yet claimed for
// its slice, or claimed for a newer one, is not held.
func (nr *newestRings) ring(w *LatencyWindow, e, k uint64) bool {
	if nr.read[k] || k > e {
		return nr.held[k]
	}
	nr.read[k] = true
	r := &w.rings[(e-k)%rings]
	if r.stamp.v.Load() != e-k+1 {
		return false
	}
	for j := range nr.counts[k] {
		nr.counts[k][j] = uint64(r.counts[2*j].Load()) + uint64(r.counts[2*j+1].Load())
	}
	nr.held[k] = true
	return true
}

// sinceMark writes into sum, coarse, the counts recorded since the mark
// of period p-back, for back in [0, marks): those of the rings of its
// slice and of any after it up to p's (read once a scan, into newest),
// less the mark. It returns their total and the fast failures among them,
// and false if the mark cannot be read or its ring turned over.
func (w *LatencyWindow) sinceMark(p, back uint64, newest *newestRings, sum *[recentBuckets]uint64) (n, fast uint64, ok bool) {
	if p < back {
		return 0, 0, false
	}
	q := p - back
	mk := &w.marks[q%marks]
	if mk.stamp.Load() != q+1 {
		return 0, 0, false
	}
	var part [recentBuckets]uint32
	ring, since := mk.ring.Load(), mk.fast.Load()
	for j := range part {
		part[j] = mk.counts[j].Load()
	}
	e := p >> periodShift
	if mk.stamp.Load() != q+1 || ring == 0 || ring > e+1 || e+1-ring >= 2 {
		return 0, 0, false
	}
	from := e + 1 - ring // the mark's slice is e-from
	if !newest.ring(w, e, from) {
		return 0, 0, false // the mark's ring turned over
	}
	if from == 1 {
		newest.ring(w, e, 0) // not held: not yet claimed for its slice, empty
	}
	for j := range sum {
		var c uint64
		for k := range from + 1 {
			c += newest.counts[k][j]
		}
		c -= min(c, uint64(part[j])) // records lost to a turnover after the mark
		sum[j] = c
		n += c
	}
	return n, min(w.fast.Load()-since, n), true
}

// upperRankOf returns the rank, among n samples, of an upper confidence
// bound on the quantile q of the distribution they were drawn from:
// ceil(q·n + z·sqrt(n·q·(1−q))) with z = noiseZ (the normal approximation
// of the binomial count of samples at or below the quantile), clamped into
// [1, n], for n ≥ 1. A q that is not a number counts as 0.
func upperRankOf(q float64, n uint64) uint64 { return boundRankOf(q, n, noiseZ) }

// lowerRankOf is upperRankOf's lower confidence bound, with z = −noiseZ.
func lowerRankOf(q float64, n uint64) uint64 { return boundRankOf(q, n, -noiseZ) }

// boundRankOf returns ceil(q·n + z·sqrt(n·q·(1−q))) clamped into [1, n].
func boundRankOf(q float64, n uint64, z float64) uint64 {
	if !(q > 0) {
		q = 0
	}
	q = min(q, 1)
	x := float64(n)
	r := math.Ceil(q*x + z*math.Sqrt(x*q*(1-q)))
	if !(r >= 1) {
		return 1
	}
	if r >= x {
		return n
	}
	return uint64(r)
}

// quantileBucket returns the bucket holding the sample of rank ceil(q·n)
// (clamped into [1, n]) among the n samples counted in sum.
func quantileBucket(sum []uint64, n uint64, q float64) int {
	return bucketOfRank(sum, rankOf(q, n))
}

// bucketOfRank returns the bucket holding the sample of the given rank
// among those counted in sum, the last if there are fewer.
func bucketOfRank(sum []uint64, rank uint64) int {
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
