package redisrate

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial to stderr; the failover tests kill
	// Redis on purpose and log what they see themselves.
	redis.SetLogger(quiet{})
	if code, ok := runChild(); ok {
		// The test binary run again as one of a fleet's processes.
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
