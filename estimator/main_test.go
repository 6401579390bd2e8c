package estimator

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the origin of the windows under test.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
