// Package fixedhedge is the textbook hedged request with a constant
// delay, which the hedging demo and benchmarks compare resilix with. It is
// not part of resilix.
package fixedhedge

import (
	"context"
	"io"
	"net/http"
	"time"
)

// Hedger sends the request and, if no answer has come after Delay, sends
// a second copy; the first answer (response or error) wins, and the other
// leg is cancelled at once and its response, if one comes, closed. It has
// no estimator, budget or gate. It copies requests with Clone, which
// shares the body, so it is for requests without one.
type Hedger struct {
	Base  http.RoundTripper
	Delay time.Duration
}

// leg is one copy's answer.
type leg struct {
	n    int // which copy: 0 or 1
	resp *http.Response
	err  error
}

func (f Hedger) RoundTrip(req *http.Request) (*http.Response, error) {
	answers := make(chan leg, 2)
	var cancels []context.CancelFunc
	send := func() {
		ctx, cancel := context.WithCancel(req.Context())
		n := len(cancels)
		cancels = append(cancels, cancel)
		go func() {
			resp, err := f.Base.RoundTrip(req.Clone(ctx))
			answers <- leg{n, resp, err}
		}()
	}

	send()
	timer := time.NewTimer(f.Delay)
	var won leg
	select {
	case won = <-answers:
		timer.Stop()
	case <-timer.C:
		send()
		won = <-answers
	}
	if len(cancels) == 2 {
		// Cancel the loser, and close what it returns off the caller's
		// path.
		lost := cancels[1-won.n]
		lost()
		go func() {
			if l := <-answers; l.resp != nil {
				l.resp.Body.Close()
			}
		}()
	}
	if won.err != nil {
		cancels[won.n]()
		return nil, won.err
	}
	// The winner's context lives until its body is closed.
	won.resp.Body = cancelOnClose{won.resp.Body, cancels[won.n]}
	return won.resp, nil
}

// cancelOnClose cancels a leg's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
