package shedding

// Split turns the fraction f of all traffic that a gate must shed into a
// shed probability per bucket, taken bottom-up: Bulk first, then BestEffort,
// then Degraded, and Critical last.
//
// mix is the recent traffic of each bucket, indexed by Priority: counts or
// rates, only their proportions matter. The volume to shed is f × Σ mix. It
// is taken from Bulk until Bulk is fully shed (probability 1), then from
// BestEffort, then from Degraded; whatever is left after those is taken from
// Critical. So:
//
//   - Σ mix[b] × Split(f, mix)[b] = f × Σ mix[b] for f in [0, 1];
//   - the probabilities never increase with importance: Bulk ≥ BestEffort ≥
//     Degraded ≥ Critical;
//   - Critical's probability is above zero only when every lower bucket's
//     is 1, that is when nothing lower is left to shed, or when f ≥ 1 (the
//     gate would refuse everything anyway).
//
// A bucket with no recent traffic sheds with probability 1 once the volume
// to shed reaches it (an arrival there is the cheapest thing left to shed),
// and 0 before. f ≤ 0 (or NaN) sheds nothing and f ≥ 1 sheds everything.
// Negative or NaN entries of mix count as zero; when the mix has no traffic
// at all, every bucket counts as having the same, so that a gate under
// pressure with no history still sheds bottom-up.
//
// Split does not allocate and is safe to call from any goroutine.
func Split(f float64, mix [NumPriorities]float64) [NumPriorities]float64 {
	var p [NumPriorities]float64
	switch {
	case !(f > 0): // also NaN
		return p
	case f >= 1:
		for i := range p {
			p[i] = 1
		}
		return p
	}
	var total float64
	for i, m := range mix {
		if !(m > 0) { // also NaN
			mix[i] = 0
		}
		total += mix[i]
	}
	if !(total > 0) || total > maxFinite {
		for i := range mix {
			mix[i] = 1
		}
		total = NumPriorities
	}
	left := f * total // the volume still to shed
	// What rounding leaves over once the volume is taken is not a reason to
	// touch the next bucket.
	eps := total * 1e-12
	for b := NumPriorities - 1; b >= 0; b-- {
		switch m := mix[b]; {
		case left <= eps:
			return p
		case left >= m:
			p[b] = 1
			left -= m
		default:
			p[b] = left / m
			left = 0
		}
	}
	return p
}

// maxFinite guards the sum of the mix against overflow to +Inf.
const maxFinite = 1.7976931348623157e308
