package tenant

import (
	"hash/maphash"
	"sync"
	"time"
)

// DefaultCapacity is the number of tenants a Tracker follows per generation
// when NewTracker is given a capacity of zero or less.
const DefaultCapacity = 64

// DefaultWindow is the history a Tracker covers when NewTracker is given a
// window of zero or less.
const DefaultWindow = 30 * time.Second

// MaxIDLen is the longest tenant id a Tracker stores as it is. A longer id
// is identified by a 64-bit keyed hash of all its bytes instead (see
// Tracker).
const MaxIDLen = 64

// maxCapacity bounds the capacity, so slot indexes fit the hash table.
const maxCapacity = 1 << 20

// longID marks a slot whose id was longer than MaxIDLen and is known by its
// hash alone.
const longID = 0xff

// Tracker follows the recent admissions of the heaviest tenants of one
// scope, in memory fixed by its capacity however many distinct ids arrive,
// and says how far a tenant is above its fair share. Gates use it to shed
// the heaviest tenant first among requests of equal priority.
//
// # Algorithm
//
// Each generation is a Space-Saving summary (Metwally, Agrawal and
// El Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data
// Streams", ICDT 2005) of capacity m: at most m counters, each an id with a
// count and an error. An admission of a tracked id increments its count. An
// admission of an untracked id takes a free counter, or else replaces the id
// of the counter with the smallest count c, and starts from count c+1 and
// error c. Over a generation of N admissions this guarantees, for every id:
//
//   - a tracked id's true count is in [count − error, count];
//   - error ≤ N/m, so any id with more than N/m admissions is tracked;
//   - an untracked id has at most the smallest count (≤ N/m) admissions.
//
// # Window
//
// The tracker keeps two generations, each Window/2 long, and counts an id
// over both, so it sees between Window/2 and Window of history. They are
// turned lazily from the now passed in: the first call in a new generation
// makes the current one the previous and starts an empty current one; no
// timer or goroutine runs, and a now earlier than the current generation
// counts in it.
//
// # Fair share and excess
//
// The fair share is the window's admissions divided by the active tenants:
// the distinct ids the two generations track (at most 2m). [Tracker.Excess]
// compares an id's guaranteed admissions (count − error, summed over both
// generations) with it: share/fair − 1, so 0 means exactly the fair share,
// above 0 heavier, −1 nothing at all. Taking the lower bound means an id is
// called heavy only when it certainly is; an untracked id is light (−1). When
// more distinct ids are active than the tracker can hold, active saturates at
// the tracked ones and the fair share is overestimated: fewer tenants look
// heavy, never more.
//
// # Memory and ids
//
// Memory is fixed at construction: two generations of m slots, each holding
// a copy of its id in a MaxIDLen-byte array, plus a hash table of indexes,
// about 13 KB at the default capacity. A header full of distinct ids cannot
// grow it. An id longer than MaxIDLen bytes is known by its 64-bit keyed
// hash (hash/maphash, with a seed drawn per tracker) rather than its bytes:
// two such ids colliding would count as one tenant, with a probability of
// about 2^-64 per pair. Add and Excess do not allocate, whether or not the
// id is tracked.
//
// Fairness is per id: an id that changes with every request is, to the
// tracker, a stream of new and light tenants. Gates skip the empty id (a
// request with no tenant).
//
// A nil *Tracker tracks nothing: Add does nothing and Excess reports 0 for
// every id. A Tracker is safe for concurrent use; each method holds one
// mutex for a hash, a probe, and (for a new id at capacity) a scan of the m
// counts.
type Tracker struct {
	genLen time.Duration
	origin time.Time
	seed   maphash.Seed

	mu        sync.Mutex
	gen       int64    // generation number of cur
	cur, prev *summary // prev receives no admissions
	both      int      // ids tracked in both cur and prev
}

// summary is one generation's Space-Saving summary.
type summary struct {
	slots []slot // len is the capacity; the first n are in use
	n     int
	table []int32 // open addressing, linear probing: slot index + 1, 0 is empty
	mask  uint64
	total uint64 // admissions in the generation
}

type slot struct {
	hash  uint64
	count uint64
	err   uint64
	other int32 // in cur: index + 1 of the same id in prev, 0 if none
	n     uint8 // length of id, or longID
	id    [MaxIDLen]byte
}

// idKey is an id prepared for lookup: its hash, computed once.
type idKey struct {
	hash uint64
	id   string
	long bool
}

// NewTracker returns an empty tracker of the given capacity (tenants
// followed per generation; DefaultCapacity when zero or less) over the
// given window (DefaultWindow when zero or less), whose first generation
// starts at now. It allocates everything the tracker will ever use.
func NewTracker(capacity int, window time.Duration, now time.Time) *Tracker {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	capacity = min(capacity, maxCapacity)
	if window <= 0 {
		window = DefaultWindow
	}
	return &Tracker{
		genLen: max(window/2, 1),
		origin: now,
		seed:   maphash.MakeSeed(),
		cur:    newSummary(capacity),
		prev:   newSummary(capacity),
	}
}

func newSummary(capacity int) *summary {
	size := 4
	for size < 2*capacity {
		size <<= 1
	}
	return &summary{
		slots: make([]slot, capacity),
		table: make([]int32, size),
		mask:  uint64(size - 1),
	}
}

// Capacity returns the number of tenants the tracker follows per
// generation.
func (t *Tracker) Capacity() int {
	if t == nil {
		return 0
	}
	return len(t.cur.slots)
}

// Add records one admission of id at now.
func (t *Tracker) Add(now time.Time, id string) {
	if t == nil {
		return
	}
	k := t.key(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	c := t.cur
	c.total++
	if i := c.lookup(&k); i >= 0 {
		c.slots[i].count++
		return
	}
	var i int
	var floor uint64
	if c.n < len(c.slots) {
		i = c.n
		c.n++
	} else {
		i = c.smallest()
		s := &c.slots[i]
		floor = s.count
		c.remove(s.hash, i)
		if s.other != 0 {
			t.both--
		}
	}
	s := &c.slots[i]
	s.hash, s.count, s.err, s.other = k.hash, floor+1, floor, 0
	if k.long {
		s.n = longID
	} else {
		s.n = uint8(copy(s.id[:], k.id))
	}
	if j := t.prev.lookup(&k); j >= 0 {
		s.other = int32(j + 1)
		t.both++
	}
	c.insert(k.hash, i)
}

// Excess reports how far id is above its fair share at now: its guaranteed
// recent admissions divided by the fair share (recent admissions / active
// tenants), minus one. It is above 0 for a tenant certainly heavier than its
// fair share, at most 0 for one at or below it, and −1 for an id the tracker
// does not follow (a light or new tenant).
func (t *Tracker) Excess(now time.Time, id string) float64 {
	if t == nil {
		return 0
	}
	k := t.key(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	var got uint64
	if i := t.cur.lookup(&k); i >= 0 {
		s := &t.cur.slots[i]
		got = s.count - s.err
		if s.other != 0 {
			p := &t.prev.slots[s.other-1]
			got += p.count - p.err
		}
	} else if j := t.prev.lookup(&k); j >= 0 {
		p := &t.prev.slots[j]
		got = p.count - p.err
	} else {
		return -1
	}
	total := t.cur.total + t.prev.total
	active := t.active()
	if total == 0 || active == 0 {
		return -1
	}
	return float64(got)*float64(active)/float64(total) - 1
}

// Count returns bounds on id's admissions in the window at now: the true
// count is in [lower, upper]. Both are 0 for an id the tracker does not
// follow, whose true count is then at most the smallest tracked count.
func (t *Tracker) Count(now time.Time, id string) (lower, upper uint64) {
	if t == nil {
		return 0, 0
	}
	k := t.key(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	for _, g := range [2]*summary{t.cur, t.prev} {
		if i := g.lookup(&k); i >= 0 {
			s := &g.slots[i]
			lower += s.count - s.err
			upper += s.count
		}
	}
	return lower, upper
}

// Active returns the number of distinct tenants the tracker follows in the
// window at now: at most twice its capacity.
func (t *Tracker) Active(now time.Time) int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	return t.active()
}

// Total returns the admissions recorded in the window at now, of every id,
// tracked or not.
func (t *Tracker) Total(now time.Time) uint64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advance(now)
	return t.cur.total + t.prev.total
}

// active returns the distinct ids of both generations. t.mu is held.
func (t *Tracker) active() int { return t.cur.n + t.prev.n - t.both }

// key prepares id for lookups.
func (t *Tracker) key(id string) idKey {
	return idKey{hash: maphash.String(t.seed, id), id: id, long: len(id) > MaxIDLen}
}

// advance turns the generations for now. t.mu is held.
func (t *Tracker) advance(now time.Time) {
	d := now.Sub(t.origin)
	if d < 0 {
		return
	}
	g := int64(d / t.genLen)
	if g <= t.gen {
		return
	}
	if g == t.gen+1 {
		t.prev, t.cur = t.cur, t.prev
	} else {
		t.prev.reset()
	}
	t.cur.reset()
	t.both = 0
	t.gen = g
}

func (s *summary) reset() {
	s.n = 0
	s.total = 0
	clear(s.table)
}

// lookup returns the index of k's slot, or -1.
func (s *summary) lookup(k *idKey) int {
	for i := k.hash & s.mask; ; i = (i + 1) & s.mask {
		e := s.table[i]
		if e == 0 {
			return -1
		}
		if sl := &s.slots[e-1]; sl.hash == k.hash && sl.matches(k) {
			return int(e - 1)
		}
	}
}

func (sl *slot) matches(k *idKey) bool {
	if k.long {
		return sl.n == longID
	}
	return int(sl.n) == len(k.id) && string(sl.id[:sl.n]) == k.id
}

// insert files slot i under hash h. The table is never more than half full,
// so the probe ends.
func (s *summary) insert(h uint64, i int) {
	j := h & s.mask
	for s.table[j] != 0 {
		j = (j + 1) & s.mask
	}
	s.table[j] = int32(i + 1)
}

// remove takes slot i, filed under hash h, out of the table, shifting back
// the entries after it in its probe run (no tombstones).
func (s *summary) remove(h uint64, i int) {
	p := h & s.mask
	for s.table[p] != int32(i+1) {
		p = (p + 1) & s.mask
	}
	s.table[p] = 0
	for j := (p + 1) & s.mask; s.table[j] != 0; j = (j + 1) & s.mask {
		e := s.table[j]
		home := s.slots[e-1].hash & s.mask
		// The entry at j may move back to the hole at p when p is on its
		// probe path, from home to j.
		if (j-home)&s.mask >= (j-p)&s.mask {
			s.table[p] = e
			s.table[j] = 0
			p = j
		}
	}
}

// smallest returns the index of a slot with the smallest count: the
// Space-Saving victim. All slots are in use.
func (s *summary) smallest() int {
	best := 0
	for i := 1; i < s.n; i++ {
		if s.slots[i].count < s.slots[best].count {
			best = i
		}
	}
	return best
}
