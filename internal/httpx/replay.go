package httpx

import (
	"errors"
	"io"
	"sync"
)

// Replay makes a request body that has no GetBody replayable, up to a
// bound: as the first attempt reads the caller's body, Replay keeps a copy
// of what it read, up to limit bytes, so that a later attempt can send the
// body again. It is the one place that reads the caller's body.
//
// Each attempt reads the body through its own reader, from Next. A reader
// first replays what was kept, then reads on from the caller's body where
// the readers before it stopped (an attempt that never connected has read
// nothing, one the server answered early has read part), keeping that too.
// Only the newest reader may read on from the caller's body: an earlier
// one, still sending for an attempt that was superseded, gets an error if
// it tries. A body that passes the bound is streamed on by the reader that
// read it, and is no longer replayable (TooLarge); limit 0 keeps nothing,
// and a body is then replayable only while no reader has read from it.
//
// Memory: one buffer per Replay, grown as the body is read and never
// holding more than limit, taken from a pool and returned to it once the
// call is over and every reader is closed (or at once when the body passes
// the bound).
//
// The caller's body is closed exactly once: at its end or at a read error;
// or, by Release, when the call is over and no attempt still sends it.
// Replay is safe for concurrent use: hedge legs may read a complete body at
// once. A reader is not: like any body, it is read by one goroutine.
type Replay struct {
	mu       sync.Mutex
	limit    int
	hint     int // the body's size, when the request said it, for the buffer's first size
	buf      []byte
	pooled   *[]byte       // buf's pool entry, if it has one
	n        int           // bytes read from the caller's body
	eof      bool          // the caller's body ended
	err      error         // the caller's body failed to read (not EOF)
	over     bool          // n passed limit: what was kept is gone
	owner    *replayReader // the reader that may read on from src
	open     int           // readers not closed
	released bool          // the call is over
	src      io.ReadCloser // the caller's body; nil once closed
	// pulling is true while a reader reads src, which is not safe for
	// concurrent reads; a reader that must wait for it waits on pulled.
	pulling bool
	pulled  sync.Cond    // on mu
	first   replayReader // Next's first reader, allocated with the Replay
	// read is called once the caller's body has been read as far as it
	// will be (see WhenRead); nil when nothing waits.
	read func()
}

// The errors a reader returns when it may not go on.
var (
	// errTakenOver is a superseded reader's, once the body has moved on
	// to a later attempt.
	errTakenOver = errors.New("resilix: request body taken over by a later attempt")
	// errTooLarge is a reader's that needs bytes that were read by an
	// earlier reader past the replay bound, and not kept.
	errTooLarge   = errors.New("resilix: request body outgrew the replay buffer")
	errReadClosed = errors.New("resilix: read of a closed request body")
)

// NewReplay returns a Replay of body keeping up to limit bytes (limit >= 0).
// sizeHint, when positive, is the body's announced size (the request's
// ContentLength), which sizes the buffer at once.
func NewReplay(body io.ReadCloser, limit int, sizeHint int64) *Replay {
	r := &Replay{src: body, limit: limit}
	r.pulled.L = &r.mu
	if sizeHint > 0 {
		r.hint = int(min(sizeHint, int64(limit)))
	}
	return r
}

// Next returns a new reader of the body from its start, and makes it the
// one that reads on from the caller's body. It returns nil when the body
// can no longer be replayed (see Replayable); the first call never does.
func (r *Replay) Next() io.ReadCloser {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rd *replayReader
	switch {
	case r.owner == nil:
		rd = &r.first
	case !r.replayableLocked():
		return nil
	default:
		rd = new(replayReader)
	}
	rd.r = r
	r.owner = rd
	r.open++
	return rd
}

// Replayable reports whether a new reader would send the whole body: no
// byte read so far was lost past the bound, and the caller's body has not
// failed.
func (r *Replay) Replayable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.replayableLocked()
}

func (r *Replay) replayableLocked() bool { return !r.over && r.err == nil }

// Complete reports whether the whole body has been read and kept, so that
// a new reader replays it from memory alone.
func (r *Replay) Complete() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eof && !r.over && r.err == nil
}

// WhenRead arranges for f to be called once the caller's body has been
// read as far as it can be kept: to its end (the body is then Complete),
// to a read error, or past the bound. It reports whether it will be: when
// the body already is, or can no longer be read (the call is over), it
// returns false and f is never called. f replaces any function an earlier
// WhenRead arranged for. f is called once, with no lock held, on the
// goroutine of the read that ended it, so it must not block; Release
// drops it.
func (r *Replay) WhenRead(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eof || r.err != nil || r.over || r.src == nil || r.released {
		return false
	}
	r.read = f
	return true
}

// TooLarge reports whether the body passed the bound, so that what was
// read of it could not all be kept.
func (r *Replay) TooLarge() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.over
}

// Mismatch reports whether what was read of the caller's body so far
// proves it does not match length, the request's ContentLength: more
// bytes than that, or an end at fewer (see Source.Mismatch).
func (r *Replay) Mismatch(length int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return mismatch(int64(r.n), r.eof, length)
}

// Err returns the caller's body's read error, if it failed.
func (r *Replay) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Release says that the call is over. When it returned no response
// (answered false), no attempt is sending the body any more, and the
// caller's body is closed now, which ends a read still blocked on it.
// When it returned one, the newest reader's attempt may still be sending
// the body (a server may answer before the upload ends): the caller's body
// is closed when that reader is, or now if it already is. Release is
// idempotent.
func (r *Replay) Release(answered bool) {
	r.mu.Lock()
	if r.released {
		r.mu.Unlock()
		return
	}
	r.released = true
	r.read = nil
	closeNow := !answered || r.owner == nil || r.owner.closed
	r.recycleLocked()
	r.mu.Unlock()
	if closeNow {
		r.closeSrc()
	}
}

// closeSrc closes the caller's body, once.
func (r *Replay) closeSrc() {
	r.mu.Lock()
	src := r.src
	r.src = nil
	r.mu.Unlock()
	if src != nil {
		_ = src.Close()
	}
}

// recycleLocked returns the buffer to its pool when nobody can read it any
// more: the body passed the bound, or the call is over and every reader is
// closed.
func (r *Replay) recycleLocked() {
	if r.buf == nil || !(r.over || r.released && r.open == 0) {
		return
	}
	putBuf(r.pooled)
	r.buf, r.pooled = nil, nil
}

// keepLocked records p, just read from the caller's body.
func (r *Replay) keepLocked(p []byte) {
	r.n += len(p)
	if r.over {
		return
	}
	if r.n > r.limit {
		r.over = true
		r.recycleLocked()
		return
	}
	if len(r.buf)+len(p) > cap(r.buf) {
		r.growLocked(len(r.buf) + len(p))
	}
	r.buf = append(r.buf, p...)
}

// growLocked gives buf room for need bytes (need <= limit): twice its
// size, or the announced size, at least need, at most limit.
func (r *Replay) growLocked(need int) {
	size := max(need, 2*cap(r.buf), r.hint, minBuf)
	size = min(size, r.limit)
	pooled := getBuf(size)
	nb := append((*pooled)[:0], r.buf...)
	putBuf(r.pooled)
	r.buf, r.pooled = nb, pooled
	*pooled = nb[:0]
}

// replayReader is one attempt's view of the body.
type replayReader struct {
	r      *Replay
	off    int // bytes of the body this reader has returned
	closed bool
}

func (rd *replayReader) Read(p []byte) (int, error) {
	r := rd.r
	r.mu.Lock()
	for {
		switch {
		case rd.closed:
			r.mu.Unlock()
			return 0, errReadClosed
		case len(p) == 0:
			r.mu.Unlock()
			return 0, nil
		case rd.off < r.n && rd.off < len(r.buf) && !r.over:
			n := copy(p, r.buf[rd.off:])
			rd.off += n
			r.mu.Unlock()
			return n, nil
		case rd.off < r.n:
			r.mu.Unlock()
			return 0, errTooLarge
		case r.err != nil:
			err := r.err
			r.mu.Unlock()
			return 0, err
		case r.eof:
			r.mu.Unlock()
			return 0, io.EOF
		case rd != r.owner:
			r.mu.Unlock()
			return 0, errTakenOver
		case r.src == nil:
			r.mu.Unlock()
			return 0, errReadClosed // the call ended with no attempt sending it
		case r.pulling:
			// A superseded reader is still reading on, blocked on a
			// slow body: wait for it, then look again.
			r.pulled.Wait()
			continue
		}
		break
	}
	// rd is at the front and may read on.
	r.pulling = true
	src := r.src
	r.mu.Unlock()
	n, err := src.Read(p)
	r.mu.Lock()
	r.pulling = false
	r.pulled.Broadcast()
	if n > 0 {
		r.keepLocked(p[:n])
		rd.off += n
	}
	done := false
	switch {
	case err == io.EOF:
		r.eof, done = true, true
	case err != nil:
		r.err, done = err, true
	}
	var read func()
	if done || r.over {
		read, r.read = r.read, nil
	}
	r.mu.Unlock()
	if done {
		r.closeSrc()
	}
	if read != nil {
		read()
	}
	return n, err
}

// Close lets go of the reader. It does not close the caller's body, which
// a later attempt may still need, unless the call is over and this is the
// reader of the attempt that answered it.
func (rd *replayReader) Close() error {
	r := rd.r
	r.mu.Lock()
	if rd.closed {
		r.mu.Unlock()
		return nil
	}
	rd.closed = true
	r.open--
	last := r.released && rd == r.owner
	r.recycleLocked()
	r.mu.Unlock()
	if last {
		r.closeSrc()
	}
	return nil
}

// Buffers are pooled by size class, powers of two from minBuf to maxPooled:
// enough for the default bound (64 KiB) without keeping larger ones, which
// are left to the collector. A pooled buffer may be up to twice a bound
// that is not a power of two; it never holds more than the bound.
const (
	minBuf      = 512
	poolClasses = 8
	maxPooled   = minBuf << (poolClasses - 1) // 64 KiB
)

var bufPools [poolClasses]sync.Pool

// classOf returns the pool class of a buffer of size n <= maxPooled: the
// smallest power of two from minBuf that holds it.
func classOf(n int) int {
	c := 0
	for s := minBuf; s < n; s *= 2 {
		c++
	}
	return c
}

// getBuf returns an empty buffer with room for size bytes.
func getBuf(size int) *[]byte {
	if size > maxPooled {
		b := make([]byte, 0, size)
		return &b
	}
	c := classOf(size)
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		*p = (*p)[:0]
		return p
	}
	b := make([]byte, 0, minBuf<<c)
	return &b
}

// putBuf returns a buffer from getBuf to its pool; nil is ignored.
func putBuf(p *[]byte) {
	if p == nil || cap(*p) > maxPooled || cap(*p) < minBuf {
		return
	}
	c := classOf(cap(*p))
	if minBuf<<c != cap(*p) {
		return // not one of ours
	}
	bufPools[c].Put(p)
}
