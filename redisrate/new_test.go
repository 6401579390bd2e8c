package redisrate

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestNewValidates: New names every bad field, one per line, and refuses
// a client that would not stop a command at its context's deadline.
// Building a client dials nothing, so no server is needed.
func TestNewValidates(t *testing.T) {
	good := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer good.Close()
	deaf := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer deaf.Close()
	deafRing := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer deafRing.Close()
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		limit  Limit
		want   []string
	}{
		{"valid", good, Limit{Rate: 1}, nil},
		{"valid, every field", good, Limit{Rate: 600, Period: time.Minute, Burst: 100, Prefix: "q:"}, nil},
		{"nil client", nil, Limit{Rate: 1}, []string{"redisrate: nil client"}},
		{"bad fields", good, Limit{Rate: 0, Period: -1, Burst: -1}, []string{
			"redisrate: Limit.Rate must be > 0, got 0",
			"redisrate: Limit.Period must be >= 0, got -1ns",
			"redisrate: Limit.Burst must be >= 0, got -1",
		}},
		{"too fine", good, Limit{Rate: 2_000_001}, []string{
			"redisrate: Limit.Rate per Limit.Period must be at most one token a microsecond, got 2000001 per 1s",
		}},
		{"client without context timeouts", deaf, Limit{Rate: 1}, []string{
			"redisrate: the client's ContextTimeoutEnabled is false",
		}},
		{"ring without context timeouts", deafRing, Limit{Rate: 1}, []string{
			"redisrate: the client's ContextTimeoutEnabled is false",
		}},
	} {
		l, err := New(tc.client, tc.limit)
		if tc.want == nil {
			if err != nil || l == nil {
				t.Errorf("%s: New = %v, %v", tc.name, l, err)
			}
			continue
		}
		if err == nil || l != nil {
			t.Errorf("%s: New = %v, %v; want an error", tc.name, l, err)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != len(tc.want) {
			t.Errorf("%s: %d lines, want %d:\n%v", tc.name, len(lines), len(tc.want), err)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(lines[i], w) {
				t.Errorf("%s: line %d is %q, want it to start with %q", tc.name, i, lines[i], w)
			}
		}
	}
}
