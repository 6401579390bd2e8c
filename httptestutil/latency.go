package httptestutil

import (
	"math"
	"math/rand/v2"
	"time"
)

// Latency is a distribution of response latencies.
//
// An [Upstream] calls Sample once per admitted request, under its lock, with
// its own seeded generator, so calls never overlap and implementations need
// not be safe for concurrent use. Sample must draw all its randomness from r
// (so a seed reproduces the run) and must not retain r. A sample below zero
// is treated as zero.
type Latency interface {
	Sample(r *rand.Rand) time.Duration
}

// LatencyFunc adapts a function to the [Latency] interface.
type LatencyFunc func(r *rand.Rand) time.Duration

// Sample returns f(r).
func (f LatencyFunc) Sample(r *rand.Rand) time.Duration { return f(r) }

// Constant returns a latency that is always d. It draws no random numbers.
func Constant(d time.Duration) Latency { return constant(d) }

type constant time.Duration

func (c constant) Sample(*rand.Rand) time.Duration { return time.Duration(c) }

// Uniform returns a latency uniformly distributed over [lo, hi], with
// nanosecond resolution. If hi <= lo, every sample is lo.
func Uniform(lo, hi time.Duration) Latency { return uniform{lo, hi} }

type uniform struct{ lo, hi time.Duration }

func (u uniform) Sample(r *rand.Rand) time.Duration {
	if u.hi <= u.lo {
		return u.lo
	}
	span := uint64(u.hi - u.lo) // no overflow: the difference of two int64s fits in a uint64
	if span == math.MaxUint64 {
		return u.lo + time.Duration(r.Uint64())
	}
	return u.lo + time.Duration(r.Uint64N(span+1))
}

// Bimodal returns a latency that, on each sample, is slow with probability
// pSlow and fast otherwise: a fast path with an occasional slow one, such as
// a cache miss or a garbage-collection pause. A pSlow of 0 or less is always
// fast; 1 or more is always slow. Each sample draws one random number.
func Bimodal(fast, slow time.Duration, pSlow float64) Latency {
	return bimodal{fast, slow, pSlow}
}

type bimodal struct {
	fast, slow time.Duration
	pSlow      float64
}

func (b bimodal) Sample(r *rand.Rand) time.Duration {
	if r.Float64() < b.pSlow {
		return b.slow
	}
	return b.fast
}

// LogNormal returns a log-normally distributed latency with the given
// median: median * exp(sigma * Z) for a standard normal Z. Sigma sets the
// spread of the tail; 0 makes it constant, 0.5 puts the 99th percentile near
// 3.2 times the median, 1 near 10 times. Samples are clamped to the largest
// time.Duration.
func LogNormal(median time.Duration, sigma float64) Latency {
	return logNormal{median, sigma}
}

type logNormal struct {
	median time.Duration
	sigma  float64
}

func (l logNormal) Sample(r *rand.Rand) time.Duration {
	z := r.NormFloat64()
	d := float64(l.median) * math.Exp(l.sigma*z)
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// Weighted is one component of a [Mix].
type Weighted struct {
	// Weight is the relative weight of this component. Components with a
	// weight of zero or less are never chosen.
	Weight float64
	// Latency is the component's distribution. If nil, Constant(0) is used.
	Latency Latency
}

// Mix returns a mixture of latencies: each sample picks one component with
// probability proportional to its weight, then samples it. With no
// positive weight, every sample is zero.
func Mix(components ...Weighted) Latency {
	m := mix{components: make([]Weighted, 0, len(components))}
	for _, c := range components {
		if c.Weight <= 0 || math.IsNaN(c.Weight) {
			continue
		}
		if c.Latency == nil {
			c.Latency = Constant(0)
		}
		m.components = append(m.components, c)
		m.total += c.Weight
	}
	return m
}

type mix struct {
	components []Weighted
	total      float64
}

func (m mix) Sample(r *rand.Rand) time.Duration {
	if len(m.components) == 0 {
		return 0
	}
	x := r.Float64() * m.total
	for _, c := range m.components {
		if x < c.Weight {
			return c.Latency.Sample(r)
		}
		x -= c.Weight
	}
	// Rounding can leave x just above the last weight.
	return m.components[len(m.components)-1].Latency.Sample(r)
}
