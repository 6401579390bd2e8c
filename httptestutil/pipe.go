package httptestutil

import (
	"io"
	"sync"
)

// pipeBuffer is how many bytes a handler may write ahead of the reader,
// like the write buffer of a net/http server connection.
const pipeBuffer = 4 << 10

// pipe is a bounded in-memory pipe between the handler, which writes, and
// the response body, which reads. Unlike io.Pipe, a write returns as soon as
// its bytes fit in the buffer, so a handler that writes a small body
// finishes without waiting for the client to read it, as it would over a
// real connection. Writes block while the buffer is full; bytes written
// before the write side is closed are still delivered, then the close
// error.
//
// Waiting is on channels, so a goroutine blocked in Read or Write is
// durably blocked inside a synctest bubble.
type pipe struct {
	mu   sync.Mutex
	buf  []byte
	werr error // set by closeWrite: io.EOF, or why the body ended
	rerr error // set by closeRead: what further writes return

	readable chan struct{} // a token: data, werr or rerr may have appeared
	writable chan struct{} // a token: space or rerr/werr may have appeared
}

func newPipe() *pipe {
	return &pipe{readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Read reads buffered bytes, blocking until some are written or the pipe
// is closed.
func (p *pipe) Read(b []byte) (int, error) {
	for {
		p.mu.Lock()
		if p.rerr != nil {
			p.mu.Unlock()
			return 0, errBodyClosed
		}
		if len(p.buf) > 0 {
			n := copy(b, p.buf)
			p.buf = p.buf[:copy(p.buf, p.buf[n:])]
			p.mu.Unlock()
			signal(p.writable)
			return n, nil
		}
		if p.werr != nil {
			err := p.werr
			p.mu.Unlock()
			return 0, err
		}
		p.mu.Unlock()
		<-p.readable
	}
}

// Write appends b to the buffer, blocking while it is full. It fails once
// either side is closed.
func (p *pipe) Write(b []byte) (int, error) {
	n := 0
	for {
		p.mu.Lock()
		switch {
		case p.rerr != nil:
			err := p.rerr
			p.mu.Unlock()
			return n, err
		case p.werr != nil:
			p.mu.Unlock()
			return n, io.ErrClosedPipe
		case len(b) == 0:
			p.mu.Unlock()
			return n, nil
		}
		if k := min(pipeBuffer-len(p.buf), len(b)); k > 0 {
			p.buf = append(p.buf, b[:k]...)
			b = b[k:]
			n += k
			p.mu.Unlock()
			signal(p.readable)
			continue
		}
		p.mu.Unlock()
		<-p.writable
	}
}

// closeWrite ends the body: readers get the buffered bytes, then err (io.EOF
// if nil). Only the first close counts.
func (p *pipe) closeWrite(err error) {
	if err == nil {
		err = io.EOF
	}
	p.mu.Lock()
	if p.werr == nil {
		p.werr = err
	}
	p.mu.Unlock()
	signal(p.readable)
	signal(p.writable)
}

// closeRead is the client closing the body: buffered bytes are dropped,
// reads fail with errBodyClosed and writes with err.
func (p *pipe) closeRead(err error) {
	p.mu.Lock()
	if p.rerr == nil {
		p.rerr = err
		p.buf = nil
	}
	p.mu.Unlock()
	signal(p.readable)
	signal(p.writable)
}
