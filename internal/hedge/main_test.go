package hedge

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newState applies the defaults, as the transport's compile step does.
func newState(h policy.Hedge, now time.Time) *State { return New(h.WithDefaults(), now) }
