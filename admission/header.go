package admission

import (
	"math"
	"strings"
	"time"

	"github.com/resilix/resilix/shedding"
)

// The bounds on what a header may hold; see the package doc.
const (
	// maxPriorityLen is the longest priority value read: "best_effort"
	// is 11 bytes, and shedding.ParsePriority's error would copy a longer
	// one whole.
	maxPriorityLen = 32
	// maxTimeout is the longest time left a caller may announce. Anything
	// longer is not a deadline anyone waits for.
	maxTimeout = 24 * time.Hour
	// maxAttempt is the largest attempt number read.
	maxAttempt = math.MaxInt32
)

// parsePriority parses a priority header's value with
// shedding.ParsePriority, without allocating: a value longer than
// maxPriorityLen is malformed unread.
func parsePriority(v string) (shedding.Priority, bool) {
	if len(v) > maxPriorityLen {
		return 0, false
	}
	p, err := shedding.ParsePriority(v)
	return p, err == nil
}

// parseMillis parses a timeout header's value: ASCII digits, surrounding
// white space ignored, a whole number of milliseconds up to maxTimeout.
func parseMillis(v string) (int64, bool) {
	return parseUint(v, maxTimeout.Milliseconds())
}

// parseAttempt parses an attempt header's value: ASCII digits, surrounding
// white space ignored, a number from 1 to maxAttempt.
func parseAttempt(v string) (int, bool) {
	n, ok := parseUint(v, maxAttempt)
	return int(n), ok && n >= 1
}

// parseUint parses v, surrounding white space trimmed, as a decimal number
// of at most limit. It reads each byte at most once and allocates nothing
// (strconv's errors keep a copy of the input).
func parseUint(v string, limit int64) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
		if n > limit {
			return 0, false
		}
	}
	return n, true
}
