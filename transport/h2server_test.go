package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/resilix/resilix/policy"
)

// h2Server is a minimal HTTP/2 server over cleartext (prior knowledge),
// written frame by frame from RFC 9113 so that a test can make it do what
// net/http's server never does on demand: refuse a stream, or send a
// GOAWAY below or above it. It speaks just enough HTTP/2 for net/http's
// client: the preface, SETTINGS and their acknowledgement, PING,
// WINDOW_UPDATE for every DATA frame it receives, and a response of
// HEADERS (":status: 200", the one-byte static-table entry 0x88) and one
// DATA frame.
//
// What it does with each stream is decide's answer, asked when the
// stream's request is complete (its body received to END_STREAM), with the
// connection's number (from 0) and the stream's id.
type h2Server struct {
	l      net.Listener
	decide func(conn int, stream uint32) h2Move

	mu     sync.Mutex
	conns  []net.Conn
	bodies [][]byte // the bodies of the requests answered 200, in order
	wg     sync.WaitGroup
}

// h2Move is what the server does with a stream.
type h2Move struct {
	refuse     bool   // RST_STREAM REFUSED_STREAM
	reset      bool   // RST_STREAM INTERNAL_ERROR: after the request was read
	goAway     bool   // GOAWAY with lastStream and code, instead of an answer
	lastStream uint32 // for goAway
	code       uint32 // for goAway
	closeAfter bool   // close the connection after the GOAWAY
}

// HTTP/2 frame types, flags and error codes used here.
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Settings     = 0x4
	h2Ping         = 0x6
	h2GoAway       = 0x7
	h2WindowUpdate = 0x8

	h2EndStream  = 0x1
	h2Ack        = 0x1
	h2EndHeaders = 0x4
	h2Padded     = 0x8
	h2Priority   = 0x20

	h2NoError       = 0x0
	h2InternalError = 0x2
	h2RefusedStream = 0x7
	h2EnhanceCalm   = 0xb
)

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func newH2Server(t *testing.T, decide func(conn int, stream uint32) h2Move) *h2Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &h2Server{l: l, decide: decide}
	s.wg.Go(s.accept)
	t.Cleanup(s.close)
	return s
}

func (s *h2Server) url() string { return "http://" + s.l.Addr().String() + "/" }

func (s *h2Server) close() {
	s.l.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *h2Server) accept() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		n := len(s.conns)
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(c, n) })
	}
}

func (s *h2Server) answered() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.bodies...)
}

// h2Conn writes frames on one connection.
type h2Conn struct {
	mu sync.Mutex
	c  net.Conn
}

func (w *h2Conn) frame(typ, flags byte, stream uint32, payload []byte) {
	var hdr [9]byte
	n := len(payload)
	hdr[0], hdr[1], hdr[2] = byte(n>>16), byte(n>>8), byte(n)
	hdr[3], hdr[4] = typ, flags
	binary.BigEndian.PutUint32(hdr[5:], stream&0x7fffffff)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.Write(append(hdr[:], payload...))
}

func u32(vs ...uint32) []byte {
	b := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return b
}

func (s *h2Server) serve(c net.Conn, conn int) {
	defer c.Close()
	preface := make([]byte, len(h2Preface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != h2Preface {
		return
	}
	w := &h2Conn{c: c}
	w.frame(h2Settings, 0, 0, nil)
	bodies := map[uint32]*bytes.Buffer{}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := hdr[3], hdr[4]
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			return
		}
		switch typ {
		case h2Settings:
			if flags&h2Ack == 0 {
				w.frame(h2Settings, h2Ack, 0, nil)
			}
		case h2Ping:
			if flags&h2Ack == 0 {
				w.frame(h2Ping, h2Ack, 0, payload)
			}
		case h2Headers:
			bodies[stream] = new(bytes.Buffer)
			if flags&h2EndStream != 0 {
				s.complete(w, conn, stream, bodies[stream])
			}
		case h2Data:
			if flags&h2Padded != 0 && len(payload) > 0 {
				pad := int(payload[0])
				payload = payload[1 : len(payload)-pad]
			}
			if b := bodies[stream]; b != nil {
				b.Write(payload)
			}
			if n > 0 {
				w.frame(h2WindowUpdate, 0, 0, u32(uint32(n)))
				w.frame(h2WindowUpdate, 0, stream, u32(uint32(n)))
			}
			if flags&h2EndStream != 0 && bodies[stream] != nil {
				if s.complete(w, conn, stream, bodies[stream]) {
					return
				}
			}
		}
	}
}

// complete does what decide says with a stream whose request has all
// arrived; it reports whether the connection is to be closed.
func (s *h2Server) complete(w *h2Conn, conn int, stream uint32, body *bytes.Buffer) (closeConn bool) {
	m := s.decide(conn, stream)
	switch {
	case m.refuse:
		w.frame(h2RSTStream, 0, stream, u32(h2RefusedStream))
	case m.reset:
		w.frame(h2RSTStream, 0, stream, u32(h2InternalError))
	case m.goAway:
		w.frame(h2GoAway, 0, 0, u32(m.lastStream, m.code))
		return m.closeAfter
	default:
		s.mu.Lock()
		s.bodies = append(s.bodies, bytes.Clone(body.Bytes()))
		s.mu.Unlock()
		w.frame(h2Headers, h2EndHeaders, stream, []byte{0x88})
		w.frame(h2Data, h2EndStream, stream, []byte("ok"))
	}
	return false
}

// h2Client returns net/http's transport speaking HTTP/2 over cleartext
// with prior knowledge, as a client of an h2Server.
func h2Client(t *testing.T) *http.Transport {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	rt := &http.Transport{Protocols: &p}
	t.Cleanup(rt.CloseIdleConnections)
	return rt
}

// TestH2ServerAnswers: the test server is a server net/http's client can
// talk to, body and all.
func TestH2ServerAnswers(t *testing.T) {
	s := newH2Server(t, func(int, uint32) h2Move { return h2Move{} })
	rt := h2Client(t)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, s.url(), bytes.NewReader(randomBytes(100<<10)))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("%s %d %q", resp.Proto, resp.StatusCode, b)
	}
	if got := s.answered(); len(got) != 1 || !bytes.Equal(got[0], randomBytes(100<<10)) {
		t.Fatal("the server did not receive the body")
	}
}

// TestLoopbackH2Unsent: over HTTP/2 with net/http's client, a POST whose
// body has no GetBody is retried, body and all, when the server refused its
// stream or sent a GOAWAY below it; it is sent once when the server reset
// the stream after reading it, or closed the connection after a GOAWAY
// that covers it, since it may then have been processed.
func TestLoopbackH2Unsent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		first   h2Move
		retried bool
	}{
		{"REFUSED_STREAM", h2Move{refuse: true}, true},
		{"graceful GOAWAY below the stream", h2Move{goAway: true, lastStream: 0, code: h2NoError}, true},
		{"GOAWAY with an error below the first stream", h2Move{goAway: true, lastStream: 0, code: h2EnhanceCalm}, true},
		{"GOAWAY below the stream, connection closed", h2Move{goAway: true, lastStream: 0, closeAfter: true}, true},
		{"stream reset after the request", h2Move{reset: true}, false},
		{"GOAWAY covering the stream, connection closed", h2Move{goAway: true, lastStream: 1, closeAfter: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newH2Server(t, func(conn int, stream uint32) h2Move {
				if conn == 0 && stream == 1 {
					return tc.first
				}
				return h2Move{}
			})
			var log attemptLog
			tr := mustNew(t, Config{Base: h2Client(t), Policies: retrySet(), Observer: log.observer()})
			payload := randomBytes(20 << 10)
			body := noGetBody(payload)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url(), body)
			resp, err := tr.RoundTrip(req)
			if !tc.retried {
				if err == nil {
					resp.Body.Close()
					t.Fatal("the POST succeeded, so it was sent again")
				}
				if len(log.attempts) != 1 || len(log.skips) != 1 || log.skips[0].Reason != policy.SkipNotReplayable {
					t.Fatalf("attempts %v, skips %+v; want one, not replayable (%v)", log.reasons(), log.skips, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v; want the retry's 200", err)
			}
			resp.Body.Close()
			if want := "[first retry/unsent]"; fmt.Sprint(log.reasons()) != want {
				t.Fatalf("attempts %v, want %s", log.reasons(), want)
			}
			if got := s.answered(); len(got) != 1 || !bytes.Equal(got[0], payload) {
				t.Fatal("the retry did not carry the body, byte for byte")
			}
			if !body.closed.Load() {
				t.Fatal("the caller's body was not closed")
			}
		})
	}
}
