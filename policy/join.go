package policy

// JoinObservers returns an Observer that calls each of the given observers'
// funcs in turn, in order, skipping nil observers and nil funcs: say, the
// OpenTelemetry observer and one of the caller's own. A func that none of
// them sets stays nil, so it still costs nothing. With no non-nil
// observers it returns nil; with one, that one.
func JoinObservers(observers ...*Observer) *Observer {
	var os []*Observer
	for _, o := range observers {
		if o != nil {
			os = append(os, o)
		}
	}
	switch len(os) {
	case 0:
		return nil
	case 1:
		return os[0]
	}
	return &Observer{
		CallDone:          join(os, func(o *Observer) func(CallInfo) { return o.CallDone }),
		AttemptDone:       join(os, func(o *Observer) func(AttemptInfo) { return o.AttemptDone }),
		Refused:           join(os, func(o *Observer) func(Refusal) { return o.Refused }),
		RetrySkipped:      join(os, func(o *Observer) func(RetrySkip) { return o.RetrySkipped }),
		HedgeStarted:      join(os, func(o *Observer) func(HedgeInfo) { return o.HedgeStarted }),
		HedgeWon:          join(os, func(o *Observer) func(HedgeInfo) { return o.HedgeWon }),
		TieCancelled:      join(os, func(o *Observer) func(HedgeInfo) { return o.TieCancelled }),
		TieRanTwice:       join(os, func(o *Observer) func(HedgeInfo) { return o.TieRanTwice }),
		HedgeSuppressed:   join(os, func(o *Observer) func(HedgeSuppression) { return o.HedgeSuppressed }),
		BreakerTransition: join(os, func(o *Observer) func(BreakerTransition) { return o.BreakerTransition }),
		MalformedHeader:   join(os, func(o *Observer) func(MalformedHeader) { return o.MalformedHeader }),
		LimitTransition:   join(os, func(o *Observer) func(LimitTransition) { return o.LimitTransition }),
		Attach:            join(os, func(o *Observer) func(StateSource) { return o.Attach }),
		StoreTransition:   join(os, func(o *Observer) func(StoreTransition) { return o.StoreTransition }),
		Pushback:          join(os, func(o *Observer) func(Pushback) { return o.Pushback }),
		LaneEjected:       join(os, func(o *Observer) func(LaneEjection) { return o.LaneEjected }),
		LaneReturned:      join(os, func(o *Observer) func(LaneEjection) { return o.LaneReturned }),
		LanesChanged:      join(os, func(o *Observer) func(LaneSetChange) { return o.LanesChanged }),
	}
}

// join returns a func that calls field(o) of every observer that sets it,
// or nil when none does.
func join[T any](os []*Observer, field func(*Observer) func(T)) func(T) {
	var fs []func(T)
	for _, o := range os {
		if f := field(o); f != nil {
			fs = append(fs, f)
		}
	}
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return func(v T) {
		for _, f := range fs {
			f(v)
		}
	}
}
