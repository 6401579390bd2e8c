package policy

import (
	"math"
)

// Budget bounds amplification: retries and hedges draw from one token
// bucket per scope, so together they cannot add more than a fixed fraction
// of the traffic however badly the dependency behaves. Two amplifiers with
// separate budgets would not bound the total.
//
// Every logical call deposits Ratio tokens (but one whose request net/http
// refused to send, an Invalid attempt, which takes its deposit back); every
// retry or hedge withdraws one, and is not sent when less than one is
// left. So that a quiet scope can still retry, the bucket also fills at
// MinPerSecond tokens per second whatever the traffic; it never holds more
// than Max, and a new scope starts full. This is the shape of gRPC's retry
// throttling and Finagle's RetryBudget. The zero value is on, with the
// defaults below.
type Budget struct {
	// Ratio is the tokens each logical call deposits: the long-run share of
	// calls that may be retried or hedged. If zero, 0.1 is used. If
	// negative, the budget is off and only Attempts bounds amplification.
	Ratio float64

	// MinPerSecond is the floor: tokens added per second whatever the
	// traffic. If zero, 1 is used. If negative, there is no floor.
	MinPerSecond float64

	// Max is the most tokens the bucket holds, and what it starts with.
	// If zero, 10 is used; otherwise it must be at least 1.
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
	b.Ratio = or(b.Ratio, 0.1)
	b.MinPerSecond = or(b.MinPerSecond, 1)
	b.Max = or(b.Max, 10)
	return b
}
