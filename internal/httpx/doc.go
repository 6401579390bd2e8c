// Package httpx holds the HTTP mechanics the transport shares, a file for
// each:
//
//   - pushback.go, hold.go: what a response asks of the next request
//     (Retry-After, parsed; the server's own shorter hint);
//   - drain.go: throwing a superseded response away without making the
//     caller wait, so that its connection is reused;
//   - repeat.go, replay.go: whether a request may be sent twice, and a
//     copy of a body without GetBody kept for the replay;
//   - unsent.go, invalid.go, permanent.go: what a wire error says: the
//     request never reached the server, net/http refused to send it at
//     all, or sending it again cannot help;
//   - headers.go, spelling.go: the configured header names, a header read
//     under any spelling of its name, and what an Observer is given of a
//     malformed one (shared with admission).
package httpx
