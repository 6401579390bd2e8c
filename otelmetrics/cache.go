package otelmetrics

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/resilix/resilix/policy"
)

// The attribute names.
const (
	attrKey      = attribute.Key("key")
	attrOutcome  = attribute.Key("outcome")
	attrKind     = attribute.Key("kind")
	attrReason   = attribute.Key("reason")
	attrGate     = attribute.Key("gate")
	attrPriority = attribute.Key("priority")
	attrStatus   = attribute.Key("http.response.status_code")
	attrHeader   = attribute.Key("http.header")
	attrState    = attribute.Key("state")
	attrLane     = attribute.Key("lane")
)

// maxCachedKeys bounds the keys whose attribute sets are cached; the
// package doc says what happens past it.
const maxCachedKeys = 2048

// The sizes of the slot arrays: one past the largest value of each enum
// this version knows. A value beyond them (a newer policy package) is
// still recorded, with attributes built for the event.
const (
	numOutcomes   = int(policy.Invalid) + 1
	numKinds      = int(policy.AttemptHedge) + 1
	numReasons    = int(policy.HedgeBodyTooLarge) + 1
	numGates      = int(policy.GateAdmission) + 1
	numPriorities = 4 // shedding.NumPriorities
	numSkips      = int(policy.SkipGate) + 1
	numEjections  = int(policy.EjectLatency) + 1 // the last EjectionReason
)

// The values of the hedges counter's outcome attribute.
const (
	hedgeStarted = iota
	hedgeWon
	hedgeTieCancelled
	hedgeTieRanTwice
	numHedgeOutcomes
)

var hedgeOutcomeNames = [numHedgeOutcomes]string{"started", "won", "tie_cancelled", "tie_ran_twice"}

// The values of the lanes gauge's state attribute.
const (
	laneOpen = iota
	laneEjected
	numLaneStates
)

var laneStateNames = [numLaneStates]string{"open", "ejected"}

// attrs is one attribute set, wrapped once in the option slices each kind
// of instrument takes, so that recording passes them without allocating.
type attrs struct {
	add []metric.AddOption
	rec []metric.RecordOption
	obs []metric.ObserveOption
}

func newAttrs(kvs ...attribute.KeyValue) *attrs {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return &attrs{
		add: []metric.AddOption{o},
		rec: []metric.RecordOption{o},
		obs: []metric.ObserveOption{o},
	}
}

// fill is the slow path of the accessors below: it stores attrs built from
// kvs in the empty slot p. Two goroutines may race to fill it; one wins and
// both return its attrs. The accessors load the slot themselves first, so
// that the warm path makes no attribute.KeyValue.
func fill(p *atomic.Pointer[attrs], kvs ...attribute.KeyValue) *attrs {
	a := newAttrs(kvs...)
	if p.CompareAndSwap(nil, a) {
		return a
	}
	return p.Load()
}

// entry holds the attribute sets of one key, each built on first use.
type entry struct {
	key      attribute.KeyValue
	base     *attrs // key alone
	outcomes [numOutcomes]atomic.Pointer[attrs]
	attempts [numKinds][numOutcomes]atomic.Pointer[attrs]
	hedges   [numHedgeOutcomes]atomic.Pointer[attrs]
	suppress [numReasons]atomic.Pointer[attrs]
	shed     [numGates][numPriorities]atomic.Pointer[attrs]
	skips    [numSkips]atomic.Pointer[attrs]
	skipGate [numGates]atomic.Pointer[attrs] // the skips with reason gate, by gate

	pushbacks [2]atomic.Pointer[attrs]    // by status: 429, 503
	malformed atomic.Pointer[headerAttrs] // the header last found malformed

	ejections [numEjections]atomic.Pointer[attrs]
	lanes     [numLaneStates]atomic.Pointer[attrs]

	perLane atomic.Pointer[[policy.MaxLanes]atomic.Pointer[laneAttrs]] // by lane index, made on the key's first lane
}

// laneAttrs is the attribute sets of one lane of a key, named name: the
// key and the lane alone (for resilix.lane.state), and with each outcome
// (for resilix.lane.attempts).
type laneAttrs struct {
	name string
	*attrs
	outcomes [numOutcomes]atomic.Pointer[attrs]
}

// outcome returns the attributes of an attempt on the lane with outcome
// o; key is the lane's key attribute.
func (l *laneAttrs) outcome(key attribute.KeyValue, o policy.Outcome) *attrs {
	kv := attrLane.String(l.name)
	if int(o) >= numOutcomes {
		return newAttrs(key, kv, attrOutcome.String(o.String()))
	}
	p := &l.outcomes[o]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, key, kv, attrOutcome.String(o.String()))
}

// headerAttrs is the attribute set of one header name.
type headerAttrs struct {
	name string
	*attrs
}

func newEntry(key string) *entry {
	kv := attrKey.String(key)
	return &entry{key: kv, base: newAttrs(kv)}
}

func (e *entry) outcome(o policy.Outcome) *attrs {
	if int(o) >= numOutcomes {
		return newAttrs(e.key, attrOutcome.String(o.String()))
	}
	p := &e.outcomes[o]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrOutcome.String(o.String()))
}

func (e *entry) attempt(k policy.AttemptKind, o policy.Outcome) *attrs {
	if int(k) >= numKinds || int(o) >= numOutcomes {
		return newAttrs(e.key, attrKind.String(k.String()), attrOutcome.String(o.String()))
	}
	p := &e.attempts[k][o]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrKind.String(k.String()), attrOutcome.String(o.String()))
}

func (e *entry) hedge(o int) *attrs {
	p := &e.hedges[o]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrOutcome.String(hedgeOutcomeNames[o]))
}

func (e *entry) suppressed(why policy.SuppressReason) *attrs {
	if int(why) >= numReasons {
		return newAttrs(e.key, attrOutcome.String("suppressed"), attrReason.String(why.String()))
	}
	p := &e.suppress[why]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrOutcome.String("suppressed"), attrReason.String(why.String()))
}

// skipped returns the attributes of a retry skipped for why; the gate
// attribute is there only when why is SkipGate.
func (e *entry) skipped(why policy.SkipReason, g policy.Gate) *attrs {
	if why == policy.SkipGate {
		if int(g) >= numGates {
			return newAttrs(e.key, attrReason.String(why.String()), attrGate.String(g.String()))
		}
		p := &e.skipGate[g]
		if a := p.Load(); a != nil {
			return a
		}
		return fill(p, e.key, attrReason.String(why.String()), attrGate.String(g.String()))
	}
	if int(why) >= numSkips {
		return newAttrs(e.key, attrReason.String(why.String()))
	}
	p := &e.skips[why]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrReason.String(why.String()))
}

// pushback returns the attributes of an answer of the given status that
// armed pushback.
func (e *entry) pushback(status int) *attrs {
	var p *atomic.Pointer[attrs]
	switch status {
	case 429:
		p = &e.pushbacks[0]
	case 503:
		p = &e.pushbacks[1]
	default:
		return newAttrs(e.key, attrStatus.Int(status))
	}
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrStatus.Int(status))
}

// malformedHeader returns the attributes of a malformed header named h. A
// key reads a handful of headers at most; the last one is kept, which is
// all a stream of the same malformed header needs.
func (e *entry) malformedHeader(h string) *attrs {
	if a := e.malformed.Load(); a != nil && a.name == h {
		return a.attrs
	}
	a := &headerAttrs{h, newAttrs(e.key, attrHeader.String(h))}
	e.malformed.Store(a)
	return a.attrs
}

// ejection returns the attributes of a lane ejected for why. The lane
// itself is not among them: its address would make a series per replica.
func (e *entry) ejection(why policy.EjectionReason) *attrs {
	if int(why) >= numEjections {
		return newAttrs(e.key, attrReason.String(why.String()))
	}
	p := &e.ejections[why]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrReason.String(why.String()))
}

// laneState returns the attributes of the lanes gauge's point for state
// s, laneOpen or laneEjected.
func (e *entry) laneState(s int) *attrs {
	p := &e.lanes[s]
	if a := p.Load(); a != nil {
		return a
	}
	return fill(p, e.key, attrState.String(laneStateNames[s]))
}

// lane returns the attribute sets of the key's lane at index, named name,
// or, when name is "", by its index. The sets of an index are kept until
// a lane of another name is seen there (with Options.LaneAddresses, when
// Endpoints gave the index to another address). An index out of range (an
// event built by hand) gets sets built for the event.
func (e *entry) lane(index int, name string) *laneAttrs {
	if index < 0 || index >= policy.MaxLanes {
		if name == "" {
			name = strconv.Itoa(index)
		}
		return &laneAttrs{name: name, attrs: newAttrs(e.key, attrLane.String(name))}
	}
	slots := e.perLane.Load()
	if slots == nil {
		slots = new([policy.MaxLanes]atomic.Pointer[laneAttrs])
		if !e.perLane.CompareAndSwap(nil, slots) {
			slots = e.perLane.Load()
		}
	}
	p := &slots[index]
	if a := p.Load(); a != nil && (name == "" || a.name == name) {
		return a
	}
	if name == "" {
		name = strconv.Itoa(index)
	}
	a := &laneAttrs{name: name, attrs: newAttrs(e.key, attrLane.String(name))}
	p.Store(a)
	return a
}

// priority is what this package needs of shedding.Priority, which it
// reads from policy.Refusal without importing shedding.
type priority interface {
	~uint8
	String() string
}

// refusal is a func rather than a method: a method cannot be generic.
func refusal[P priority](e *entry, g policy.Gate, p P) *attrs {
	if int(g) >= numGates || int(p) >= numPriorities {
		return newAttrs(e.key, attrGate.String(g.String()), attrPriority.String(p.String()))
	}
	s := &e.shed[g][p]
	if a := s.Load(); a != nil {
		return a
	}
	return fill(s, e.key, attrGate.String(g.String()), attrPriority.String(p.String()))
}

// cache maps keys to their entries, for at most maxCachedKeys keys. Lookups
// are lock-free; adding a key takes a mutex.
type cache struct {
	m  sync.Map // string → *entry
	mu sync.Mutex
	n  int // keys in m; guarded by mu, as are all writes to m
}

func (c *cache) get(key string) *entry {
	if v, ok := c.m.Load(key); ok {
		return v.(*entry)
	}
	return c.add(key)
}

func (c *cache) add(key string) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m.Load(key); ok {
		return v.(*entry)
	}
	if c.n >= maxCachedKeys {
		// Forget every key rather than track recency on the hot path:
		// the keys in use come back on their next event.
		c.m.Clear()
		c.n = 0
	}
	// The entry outlives the event: a copy of the key, which may be a
	// piece of a much larger string (a request's URL).
	key = strings.Clone(key)
	e := newEntry(key)
	c.m.Store(key, e)
	c.n++
	return e
}
