package transport

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
)

// What a response body holds of its attempt until it is read to its end
// or closed: the attempt's context and bulkhead slot (releaser), and
// Timeout.Idle's watchdog over its reads.

// releaser is a response body that releases what its attempt held, the
// attempt's context and its bulkhead slot, exactly once: at EOF, at a read
// error, or at Close.
type releaser struct {
	rc       io.ReadCloser
	cancel   context.CancelCauseFunc
	bulkhead *gate.Bulkhead // nil once a retry took the slot over
	done     atomic.Bool
	idle     *watchdog // Timeout.Idle's, or nil
}

func (r *releaser) release() {
	if r.done.CompareAndSwap(false, true) {
		if r.idle != nil {
			r.idle.stop()
		}
		free(r.cancel, r.bulkhead)
	}
}

// free releases what an attempt held: its context, if it has its own, and
// its bulkhead slot, if it took one.
func free(cancel context.CancelCauseFunc, bulkhead *gate.Bulkhead) {
	if cancel != nil {
		cancel(context.Canceled)
	}
	if bulkhead != nil {
		bulkhead.Release()
	}
}

func (r *releaser) Read(p []byte) (int, error) {
	w := r.idle
	if w == nil {
		n, err := r.rc.Read(p)
		if err != nil {
			r.release()
		}
		return n, err
	}
	w.reads.Add(1) // odd: a Read waits
	n, err := r.rc.Read(p)
	w.reads.Add(1)
	if err != nil {
		if err != io.EOF && w.fired.Load() {
			err = &idleTimeoutError{after: w.d}
		}
		r.release()
	}
	return n, err
}

func (r *releaser) Close() error {
	err := r.rc.Close()
	r.release()
	return err
}

func (r *releaser) unwrap() *releaser { return r }

// wrapBody returns r as the body in place of b, keeping what b can do
// beyond reading: an upgraded (101) connection stays writable, and
// half-closable where b is (httputil.ReverseProxy calls CloseWrite).
func wrapBody(b io.ReadCloser, r *releaser) io.ReadCloser {
	rw, ok := b.(io.ReadWriteCloser)
	if !ok {
		return r
	}
	if cw, ok := b.(interface{ CloseWrite() error }); ok {
		return &releaserRWC{releaserRW{r, rw}, cw}
	}
	return &releaserRW{r, rw}
}

// releaserRW keeps an upgraded body writable.
type releaserRW struct {
	*releaser
	w io.Writer
}

func (r *releaserRW) Write(p []byte) (int, error) { return r.w.Write(p) }

// releaserRWC keeps an upgraded body half-closable too.
type releaserRWC struct {
	releaserRW
	cw interface{ CloseWrite() error }
}

func (r *releaserRWC) CloseWrite() error { return r.cw.CloseWrite() }

// heldSlot returns the releaser of resp's body if it still holds a
// bulkhead slot, or nil. resp must not be in use by anyone else.
func heldSlot(resp *http.Response) *releaser {
	if resp == nil {
		return nil
	}
	b, ok := resp.Body.(interface{ unwrap() *releaser })
	if !ok {
		return nil
	}
	r := b.unwrap()
	if r.bulkhead == nil || r.done.Load() {
		return nil
	}
	return r
}

// idleChecks is how many times per Idle a watchdog looks at its body.
const idleChecks = 4

// watchdog bounds the waits of a response body's reads by Timeout.Idle
// with one timer, and no timer work per Read. Each Read adds one to reads
// as it starts and one as it ends, so reads is odd while a Read waits. The
// timer wakes every Idle/idleChecks; a wake that finds the same waiting
// Read (the same odd count) as the last idleChecks wakes before it knows
// that Read has waited at least Idle, and at most Idle/idleChecks more,
// and fires: it cancels the attempt's context with the idle error, which
// makes net/http end the Read and drop the connection, and stops for good;
// the Read's error releases what the attempt held. Otherwise it re-arms. A
// wake after the body is released does nothing, and nothing re-arms it:
// the timer ends with the body.
type watchdog struct {
	d     time.Duration
	r     *releaser
	reads atomic.Uint64
	fired atomic.Bool
	live  *atomic.Int64 // the transport's count of watchdogs not stopped

	mu      sync.Mutex
	timer   *time.Timer
	seen    uint64 // reads at the last wake
	waited  int    // wakes in a row that found the same Read waiting
	stopped bool
}

// watch starts a watchdog of Idle d over r's reads.
func watch(r *releaser, d time.Duration, live *atomic.Int64) {
	w := &watchdog{d: d, r: r, live: live}
	live.Add(1)
	r.idle = w
	w.mu.Lock()
	w.timer = time.AfterFunc(d/idleChecks, w.wake)
	w.mu.Unlock()
}

func (w *watchdog) wake() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	switch v := w.reads.Load(); {
	case v%2 == 0 || v != w.seen:
		w.seen, w.waited = v, 0 // nothing waits, or a new Read does
	default:
		w.waited++
	}
	if w.waited < idleChecks {
		w.timer.Reset(w.d / idleChecks)
		w.mu.Unlock()
		return
	}
	// Fired: the watchdog's work ends here. What the attempt holds is
	// released as the Read fails, which cancelling makes net/http's do
	// at once; a base deaf to cancellation keeps its slot until the
	// caller closes the body, so the bulkhead still bounds its exchanges.
	w.fired.Store(true)
	w.stopLocked()
	w.mu.Unlock()
	if w.r.cancel != nil {
		w.r.cancel(&idleTimeoutError{after: w.d})
	}
}

// stop ends the watchdog, once.
func (w *watchdog) stop() {
	w.mu.Lock()
	w.stopLocked()
	w.mu.Unlock()
}

func (w *watchdog) stopLocked() {
	if !w.stopped {
		w.stopped = true
		w.timer.Stop()
		w.live.Add(-1)
	}
}

// idleTimeoutError is the error of a response body read that waited
// Timeout.Idle for its next bytes. It matches policy.ErrAttemptTimeout and
// context.DeadlineExceeded, and is a net.Error whose Timeout is true.
type idleTimeoutError struct{ after time.Duration }

func (e *idleTimeoutError) Error() string {
	return "resilix: attempt timed out: no response body bytes for " + e.after.String()
}

func (e *idleTimeoutError) Is(target error) bool {
	return target == policy.ErrAttemptTimeout || target == context.DeadlineExceeded
}

func (e *idleTimeoutError) Timeout() bool { return true }

func (e *idleTimeoutError) Temporary() bool { return true }

func closeBody(b io.ReadCloser) {
	if b != nil {
		_ = b.Close()
	}
}
