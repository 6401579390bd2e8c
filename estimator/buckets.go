package estimator

import (
	"math/bits"
	"time"
)

// The bucket layout is log-linear, in units of 1024 ns (about 1 µs; a
// shift, not a division, converts): units 0 to 15 get one bucket each, then
// every octave [2^k, 2^(k+1)) units for k = 4 ... 26 is cut into 8 equal
// buckets, 200 buckets in all. Buckets 0 to 7 (below 8192 ns) are the linear
// region; from bucket 8 on, no bucket is wider than 1/8 (12.5%) of its lower
// bound. The top bucket ends at 2^27 units = 2^37 ns, about 137.4 s.
const (
	unitShift     = 10                            // a unit is 1<<unitShift ns
	subBits       = 3                             // 1<<subBits buckets per octave
	linearBuckets = 1 << subBits                  // buckets in the linear region
	linearNanos   = linearBuckets << unitShift    // end of the linear region, in ns
	topUnits      = 1 << 27                       // end of the top bucket, in units
	topNanos      = topUnits << unitShift         // end of the top bucket, in ns
	numBuckets    = (27 - subBits + 1) << subBits // 200
)

// MaxDuration is the upper bound of the top bucket, about 137.4 s. A
// [LatencyWindow] clamps longer durations into the top bucket, and reports
// MaxDuration for a quantile that falls there.
const MaxDuration time.Duration = topNanos

// bucketIndex returns the bucket holding d. d ≤ 0 goes to bucket 0 and
// d ≥ MaxDuration to the top bucket. It costs a shift, a bits.Len64 and a
// few integer operations: no division, no floating point.
func bucketIndex(d time.Duration) int {
	if uint64(d) >= topNanos {
		if d < 0 {
			return 0
		}
		return numBuckets - 1
	}
	u := uint64(d) >> unitShift
	// s is how far u is shifted to leave its top four bits: 0 below 16
	// units, then one more per octave.
	s := bits.Len64(u|linearBuckets) - (subBits + 1)
	return s<<subBits + int(u>>uint(s))
}

// bucketLower returns the smallest duration in bucket i, for i in
// [0, numBuckets]; bucketLower(numBuckets) is MaxDuration.
func bucketLower(i int) time.Duration {
	if i < 2*linearBuckets {
		return time.Duration(i) << unitShift
	}
	s := i>>subBits - 1
	m := linearBuckets + i&(linearBuckets-1)
	return time.Duration(m) << (s + unitShift)
}

// bucketUpper returns the exclusive upper bound of bucket i: every duration
// in the bucket is below it.
func bucketUpper(i int) time.Duration {
	return bucketLower(i + 1)
}
