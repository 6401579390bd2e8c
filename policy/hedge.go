package policy

import "time"

// Hedge sends a second copy of a slow call and takes whichever answers
// first, cancelling the other.
//
// A call is slow when it has waited longer than a live quantile of the
// scope's recent latency, never a constant: during a brownout the quantile
// rises with the latency, so the share of calls hedged stays near
// 1 − Quantile instead of every call doubling. There is no fixed-delay
// option, on purpose.
//
// Hedge follows Retry's rule for what may be sent twice: a plain POST is
// never hedged.
type Hedge struct {
	// Quantile of recent attempt latency after which a hedge is
	// considered, in (0, 1). If zero, 0.95 is used.
	Quantile float64

	// MaximumConcurrent is the most legs of one call in flight at once,
	// the first included. If zero, 2 is used; otherwise at least 2.
	MaximumConcurrent int

	// MinimumSamples is the number of latencies the window must hold
	// before any hedge is sent. If zero, 20 is used.
	MinimumSamples int

	// Window is how much latency history the quantile is taken over. If
	// zero, 30s is used.
	Window time.Duration

	// SuppressAt stops hedging when the scope's error rate reaches this
	// fraction of the breaker's trip point, in (0, 1]. If zero, 0.5 is
	// used; 1 suppresses only where the breaker would trip anyway.
	SuppressAt float64

	// WinRate, when set, backs hedging off while hedges rarely win.
	WinRate *WinRate
}

// WinRate backs hedging off when hedges stop paying: an allowance of hedges
// moves by AIMD on the share of recent hedges that won.
type WinRate struct {
	// Floor is the win rate below which the allowance is halved, in
	// (0, 1). If zero, 0.1 is used.
	Floor float64
	// MinimumAllowance is the smallest allowance, in (0, 1]. If zero,
	// 0.05 is used.
	MinimumAllowance float64
	// MinimumSamples is the number of hedges a window needs before its win
	// rate is judged. If zero, 10 is used.
	MinimumSamples int
}

func (h *Hedge) validate() error {
	switch {
	case h.Quantile != 0 && !(h.Quantile > 0 && h.Quantile < 1):
		return fieldErr("Hedge.Quantile", "must be in (0, 1), got %v", h.Quantile)
	case h.MaximumConcurrent != 0 && h.MaximumConcurrent < 2:
		return fieldErr("Hedge.MaximumConcurrent", "must be >= 2 (it counts the first leg), got %d", h.MaximumConcurrent)
	case h.MinimumSamples < 0:
		return fieldErr("Hedge.MinimumSamples", "must be >= 0, got %d", h.MinimumSamples)
	case h.Window < 0:
		return fieldErr("Hedge.Window", "must be >= 0, got %v", h.Window)
	case h.SuppressAt != 0 && !(h.SuppressAt > 0 && h.SuppressAt <= 1):
		return fieldErr("Hedge.SuppressAt", "must be in (0, 1], got %v", h.SuppressAt)
	}
	if w := h.WinRate; w != nil {
		switch {
		case w.Floor != 0 && !(w.Floor > 0 && w.Floor < 1):
			return fieldErr("Hedge.WinRate.Floor", "must be in (0, 1), got %v", w.Floor)
		case w.MinimumAllowance != 0 && !(w.MinimumAllowance > 0 && w.MinimumAllowance <= 1):
			return fieldErr("Hedge.WinRate.MinimumAllowance", "must be in (0, 1], got %v", w.MinimumAllowance)
		case w.MinimumSamples < 0:
			return fieldErr("Hedge.WinRate.MinimumSamples", "must be >= 0, got %d", w.MinimumSamples)
		}
	}
	return nil
}
