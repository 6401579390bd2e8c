package policy

// Limiter is an adaptive concurrency limit learned from latency, with a
// bounded priority queue in front of it. See AdaptiveLimiter for the
// algorithm and what the caller observes.
type Limiter struct {
	// InitialLimit is the concurrency limit before anything is learned.
	// If zero, 20 is used. It is kept within [MinLimit, MaxLimit].
	InitialLimit int
	// MinLimit is the lowest the limit goes. If zero, 1 is used.
	MinLimit int
	// MaxLimit is the highest the limit goes. If zero, 1000 is used.
	MaxLimit int
	// QueueFactor sizes the wait queue as a multiple of the current limit:
	// ceil(QueueFactor × limit) calls may wait for a slot. If zero, 0.5 is
	// used (Google SRE book, chapter 22: small queues relative to
	// capacity). If negative, nothing waits.
	QueueFactor float64
}

func (l *Limiter) validate() error {
	switch {
	case l.InitialLimit < 0:
		return fieldErr("Limiter.InitialLimit", "must be >= 0, got %d", l.InitialLimit)
	case l.MinLimit < 0:
		return fieldErr("Limiter.MinLimit", "must be >= 0, got %d", l.MinLimit)
	case l.MaxLimit < 0:
		return fieldErr("Limiter.MaxLimit", "must be >= 0, got %d", l.MaxLimit)
	case or(l.MinLimit, 1) > or(l.MaxLimit, 1000):
		return fieldErr("Limiter.MinLimit", "(%d) must be <= Limiter.MaxLimit (%d)", or(l.MinLimit, 1), or(l.MaxLimit, 1000))
	case l.QueueFactor != l.QueueFactor || l.QueueFactor > 100:
		return fieldErr("Limiter.QueueFactor", "must be a number <= 100, got %v", l.QueueFactor)
	}
	return nil
}

// WithDefaults returns l with every zero field set to its default, and
// InitialLimit brought within [MinLimit, MaxLimit].
func (l Limiter) WithDefaults() Limiter {
	l.MinLimit = or(l.MinLimit, 1)
	l.MaxLimit = or(l.MaxLimit, 1000)
	l.InitialLimit = min(max(or(l.InitialLimit, 20), l.MinLimit), l.MaxLimit)
	l.QueueFactor = or(l.QueueFactor, 0.5)
	return l
}
