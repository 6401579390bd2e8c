package slogobserver_test

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
)

// record is a log record as the tests compare it: its attributes' values
// as slog's text handler prints them, and the request id of the context
// it was handled with.
type record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
	ReqID string
}

type requestIDKey struct{}

// recorder is a slog.Handler that keeps every record at or above its
// level. It is safe for concurrent use.
type recorder struct {
	level slog.Level
	mu    sync.Mutex
	recs  []record
}

func (h *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *recorder) Handle(ctx context.Context, r slog.Record) error {
	rec := record{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	rec.ReqID, _ = ctx.Value(requestIDKey{}).(string)
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { panic("not used") }
func (h *recorder) WithGroup(string) slog.Handler      { panic("not used") }

// take returns the records kept so far, and forgets them.
func (h *recorder) take() []record {
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := h.recs
	h.recs = nil
	return recs
}

// with returns the records whose message is msg.
func with(recs []record, msg string) []record {
	return slices.DeleteFunc(slices.Clone(recs), func(r record) bool { return r.Msg != msg })
}

// messages returns the records' messages, one a line, for error output.
func messages(recs []record) string {
	var b strings.Builder
	for _, r := range recs {
		b.WriteString("\n\t" + r.Level.String() + " " + r.Msg)
		for _, k := range slices.Sorted(maps.Keys(r.Attrs)) {
			b.WriteString(" " + k + "=" + r.Attrs[k])
		}
	}
	return b.String()
}
