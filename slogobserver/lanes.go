package slogobserver

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
)

// A lane is starved when its share of its key's attempts over a window is
// below a tenth of its fair share, the key's attempts over a window
// spread evenly over its lanes not ejected, and fed again when it is at a
// fifth or more. The Logger counts each key's attempts by lane and judges
// a window at the key's first attempt after it: a lane starved by the
// picker (a replica that is slow, or that refuses or holds back its
// attempts) is logged once, as an ejected one is, and once when it is fed
// again.
const (
	// laneWindow is the picker's own horizon: its latency estimates decay
	// with a 10 s time constant, and its failure-rate ejection judges 10 s
	// intervals, so a shorter window would see the picker's noise.
	laneWindow = 10 * time.Second

	// starvedShare and fedShare, of a fair share: the gap between them
	// keeps a lane near the line from logging each window.
	starvedShare, fedShare = 0.1, 0.2

	// minFairShare is the fewest attempts a fair share must be for a
	// window to be judged: with even picks, a lane gets fewer than 2 of a
	// fair 20 with a chance of about 1e-7, so only a starved lane does.
	minFairShare = 20

	// maxWatchedKeys bounds the keys whose lanes are watched, as
	// transport.DefaultMaxKeys bounds the keys a transport keeps; a key
	// with no attempt for two windows is forgotten.
	maxWatchedKeys = 1024
)

// laneWatch counts each key's attempts by lane. Its own lock keeps it off
// the summaries'.
type laneWatch struct {
	mu    sync.Mutex
	keys  map[string]*laneKey
	sweep time.Time // when keys with no recent attempt are next forgotten
}

// laneKey is a key's window.
type laneKey struct {
	start time.Time // the window's
	last  time.Time // the last attempt's
	lanes []laneTally
}

// laneTally is a lane's count in its key's window.
type laneTally struct {
	name     string
	since    time.Time // known since, or back from an ejection since: judged over the windows that start after
	attempts int
	ejected  bool
	starved  bool
}

// laneChange is a lane's change of state, to be logged with no lock held.
type laneChange struct {
	key, lane        string
	starved          bool
	attempts         int
	share, fairShare float64
	window           time.Duration
}

// find returns the index of the lane named name, adding it when the key
// has fewer than policy.MaxLanes, or -1.
func (k *laneKey) find(name string, now time.Time) int {
	for i := range k.lanes {
		if k.lanes[i].name == name {
			return i
		}
	}
	if len(k.lanes) >= policy.MaxLanes {
		return -1
	}
	k.lanes = append(k.lanes, laneTally{name: name, since: now})
	return len(k.lanes) - 1
}

// watchLane counts an attempt on its lane, when the handler would write a
// starved lane's record: first, when its key's window has passed, it
// judges the window and logs the lanes whose state changed, with no lock
// held, and the attempt starts the next window. It allocates only for a key or a lane it
// starts watching, and to write.
func (lg *Logger) watchLane(a policy.AttemptInfo) {
	out, ok := lg.at(a.Context, slog.LevelWarn)
	if !ok {
		return
	}
	now := time.Now()
	w := &lg.lanes
	w.mu.Lock()
	if now.After(w.sweep) {
		for key, k := range w.keys {
			if now.Sub(k.last) > 2*laneWindow {
				delete(w.keys, key)
			}
		}
		w.sweep = now.Add(laneWindow)
	}
	k := w.keys[a.Key]
	if k == nil {
		if len(w.keys) >= maxWatchedKeys {
			w.mu.Unlock()
			return
		}
		k = &laneKey{start: now}
		w.keys[a.Key] = k
	}
	var changes []laneChange
	if now.Sub(k.start) >= laneWindow {
		changes = k.judge(a.Key, now)
	}
	k.last = now
	if i := k.find(a.Lane, now); i >= 0 {
		k.lanes[i].attempts++
	}
	w.mu.Unlock()
	for _, c := range changes {
		c.emit(out.h)
	}
}

// judge ends the key's window at now: it returns the lanes whose state
// changed, and starts the next window.
func (k *laneKey) judge(key string, now time.Time) []laneChange {
	var total, open int
	for _, l := range k.lanes {
		if !l.ejected {
			total += l.attempts
			open++
		}
	}
	var changes []laneChange
	if open >= 2 && float64(total)/float64(open) >= minFairShare {
		fair := float64(total) / float64(open)
		for i := range k.lanes {
			l := &k.lanes[i]
			if l.ejected || !l.since.Before(k.start) {
				continue
			}
			share := float64(l.attempts) / fair
			if l.starved && share < fedShare || !l.starved && share >= starvedShare {
				continue
			}
			l.starved = !l.starved
			changes = append(changes, laneChange{
				key: key, lane: l.name, starved: l.starved, attempts: l.attempts,
				share: round(float64(l.attempts) / float64(total)), fairShare: round(1 / float64(open)),
				window: now.Sub(k.start),
			})
		}
	}
	for i := range k.lanes {
		k.lanes[i].attempts = 0
	}
	k.start = now
	return changes
}

// round rounds a share to 4 decimals, enough for a tenth of a fair share
// of 64 lanes, and short to read.
func round(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// eject marks a watched key's lane ejected, or back: an ejected lane is
// not judged (its ejection is logged), and one back is judged from the
// next window, after its probe and slow start.
func (w *laneWatch) eject(key, lane string, ejected bool) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.keys[key]
	if k == nil {
		return
	}
	if i := k.find(lane, now); i >= 0 {
		k.lanes[i] = laneTally{name: lane, since: now, attempts: k.lanes[i].attempts, ejected: ejected}
	}
}

// change applies an answer of Endpoints to a watched key's lanes: those
// added are known from now, those removed are forgotten, and so is the
// lane that dialed the request's own address before the first answer,
// named by its index (an address has a port).
func (w *laneWatch) change(c policy.LaneSetChange) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.keys[c.Key]
	if k == nil {
		return
	}
	for _, a := range c.Added {
		k.find(a, now)
	}
	k.lanes = slices.DeleteFunc(k.lanes, func(l laneTally) bool {
		return !strings.Contains(l.name, ":") || slices.Contains(c.Removed, l.name)
	})
}

// emit writes the change: Warn for a lane starved, Info for one fed
// again, with the window's counts.
func (c laneChange) emit(h slog.Handler) {
	level, msg := slog.LevelWarn, msgLaneStarved
	if !c.starved {
		level, msg = slog.LevelInfo, msgLaneFed
	}
	out := sink{ctx: context.Background(), h: h, level: level} // no one call's: the window's
	if !h.Enabled(out.ctx, level) {
		return
	}
	out.log(msg,
		slog.String(attrKey, c.key),
		slog.String(attrLane, c.lane),
		slog.Int(attrAttempts, c.attempts),
		slog.Float64(attrShare, c.share),
		slog.Float64(attrFairShare, c.fairShare),
		millis(attrSince, c.window),
	)
}
