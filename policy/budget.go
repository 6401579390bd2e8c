package policy

import (
	"math"
)

// Budget bounds amplification: retries and hedges draw from one token
// bucket per scope, so together they cannot add more than a fixed fraction
// of the traffic however badly the dependency behaves. Two amplifiers with
// separate budgets would not bound the total.
//
// It bounds waste, not help. Every logical call deposits Ratio tokens
// (but one whose request net/http refused to send, an Invalid attempt,
// takes its deposit back); every retry or hedge withdraws one, and is not
// sent when less than one is left; a retry whose answer is the call's
// success, and a hedge that wins, refund theirs. So the tokens that stay
// spent are those of wire calls whose answer the caller did not get:
// retries that failed, hedges that lost, and the first leg of a hedged
// retry round that its hedge won (that round refunds the hedge's token,
// not the retry's; a call refunds at most once). So that a quiet scope can
// still retry, the bucket also fills at MinPerSecond tokens per second
// whatever the traffic; it never holds more than Max, and a new scope
// starts full.
//
// Hedges buy latency, not answers, so they have an allowance within the
// bucket: a hedge also needs a token of a second bucket, to which each
// call adds half of Ratio and which holds half of Max, at most 10 (no
// floor). In a brownout's first moments, before the latency quantile has
// caught up, nearly every call comes due for a hedge and nearly every
// hedge loses; the allowance holds that to 10% of calls, and a burst of
// hedges (a stall of the caller's machine makes every call in flight late
// at once) never takes more than half of the bucket from the retries that
// follow it. So with Max below 2, where half the bucket is less than a
// token, the budget sends no hedges at all: a bucket that small is the
// retries'. The allowance also lets go of what it holds above one token,
// with a time constant of 2 s: a scope holds one hedge and about what its
// last two seconds of calls deposited, so that a fleet of small clients
// (each at a few calls a second) does not send every client's 10 into the
// first second of a collapse; a scope of 50 calls a second or more keeps
// its 10.
//
// With the defaults, a host that fails a random 20% of attempts is retried
// through: the 0.24 retries a call that takes (0.2 + 0.2²) withdraw, and
// the 0.19 that succeed refund, leaving 0.05 a call spent of the 0.2
// deposited. A full outage, where every retry and hedge fails, refunds
// nothing: it costs at most Ratio more calls (a fifth), plus MinPerSecond
// a second, plus the Max the bucket held when it began; at 1000 calls a
// second for four seconds, 1.21 wire calls a call. The shape is gRPC's
// retry throttling and Finagle's RetryBudget; the ratio and the floor are
// Finagle's defaults (20% of requests, at least 10 retries a second), and
// the ratio is Envoy's retry budget's. The zero value is on, with the
// defaults below.
type Budget struct {
	// Ratio is the tokens each logical call deposits: the long-run share of
	// calls that may be retried or hedged in vain. If zero, 0.2 is used. If
	// negative, the budget is off and only Attempts bounds amplification.
	Ratio float64

	// MinPerSecond is the floor: tokens added per second whatever the
	// traffic. If zero, 10 is used. If negative, there is no floor.
	MinPerSecond float64

	// Max is the most tokens the bucket holds, and what it starts with:
	// the burst of retries and hedges it allows at once, and the most a
	// full outage costs beyond the ratio and the floor. If zero, two
	// seconds of the floor are used, 2 × MinPerSecond (20 with the default
	// floor), and no less than 10. Otherwise it must be at least 1; below 2
	// it holds retries only (see the hedges' allowance above).
	Max float64
}

func (b *Budget) validate() error {
	return joinErrs(
		fieldErrIf(math.IsNaN(b.Ratio) || math.IsInf(b.Ratio, 0),
			"Budget.Ratio", "must be a finite number, got %v", b.Ratio),
		fieldErrIf(math.IsNaN(b.MinPerSecond) || math.IsInf(b.MinPerSecond, 0),
			"Budget.MinPerSecond", "must be a finite number, got %v", b.MinPerSecond),
		fieldErrIf(b.Max != 0 && !(b.Max >= 1 && b.Max < math.Inf(1)),
			"Budget.Max", "must be 0 (default) or a finite number >= 1, got %v", b.Max),
	)
}

// WithDefaults returns b with every zero field set to its default.
func (b Budget) WithDefaults() Budget {
	b.Ratio = or(b.Ratio, 0.2)
	b.MinPerSecond = or(b.MinPerSecond, 10)
	b.Max = or(b.Max, max(10, 2*b.MinPerSecond))
	return b
}
