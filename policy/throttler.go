package policy

import "time"

// Throttler is client-side adaptive throttling, from Google's SRE book,
// chapter 21 ("Handling Overload"): the client refuses a call locally with
// probability max(0, (requests − K·accepts) / (requests + 1)) over a recent
// window, so a dependency that is refusing work stops receiving it.
type Throttler struct {
	// K is how many requests per accept the client lets through before it
	// starts throttling; at least 1. If zero, 2 is used (the book's
	// choice).
	K float64

	// Window is how much history requests and accepts are counted over.
	// If zero, 2m is used, the book's choice.
	Window time.Duration
}

func (t *Throttler) validate() error {
	switch {
	case t.K != 0 && !(t.K >= 1 && t.K < 1e9):
		return fieldErr("Throttler.K", "must be >= 1, got %v", t.K)
	case t.Window < 0:
		return fieldErr("Throttler.Window", "must be >= 0, got %v", t.Window)
	}
	return nil
}
