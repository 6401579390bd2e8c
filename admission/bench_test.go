package admission

import (
	"context"
	"net/http"
	"testing"

	"github.com/resilix/resilix/internal/orca"
)

// BenchmarkHandler measures what admission adds to a handler that answers
// at once, on a ResponseWriter that keeps nothing, so that only the
// middleware is on the clock: the bare handler, then admission with no
// header, with a trusted caller's priority, tenant and attempt, and with a
// timeout too (the deadline's context and timer). The limit is never
// reached.
func BenchmarkHandler(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	h := mustHandler(b, ok, Config{Trust: trustAll, LoadReports: ReportNone})
	reporting := mustHandler(b, ok, Config{Trust: trustAll})
	headers := []string{"Resilix-Priority", "bulk", "Resilix-Tenant", "acme", "Resilix-Attempt", "2"}
	for _, bc := range []struct {
		name string
		h    http.Handler
		kv   []string
	}{
		{"bare", ok, nil},
		{"admission", h, nil},
		{"admission-headers", h, headers},
		{"admission-headers-timeout", h, append(headers, "Resilix-Timeout-Ms", "5000")},
		{"admission-load-report", reporting, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRequest(context.Background(), bc.kv...)
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				delete(w.h, orca.Header) // a fresh answer's header
				bc.h.ServeHTTP(w, r)
			}
		})
	}
	b.Run("admission-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := newRequest(context.Background())
			w := &discard{h: http.Header{}}
			for pb.Next() {
				h.ServeHTTP(w, r)
			}
		})
	})
}
