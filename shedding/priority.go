// Package shedding defines the four priority buckets resilix sheds by, the
// context helpers that carry a request's priority, and the rule that turns a
// gate's pressure into refusals per bucket ([Split]).
//
// # The buckets
//
// The buckets are Netflix's, from "Enhancing Netflix Reliability with
// Service-Level Prioritized Load Shedding" (Netflix Technology Blog, 2024),
// themselves inspired by Linux tc-prio. Their definitions, verbatim:
//
//	CRITICAL     "Affect core functionality — These will never be shed if we
//	             are not in complete failure."
//	DEGRADED     "Affect user experience — These will be progressively shed
//	             as the load increases."
//	BEST_EFFORT  "Do not affect the user — These will be responded to in a
//	             best effort fashion and may be shed progressively in normal
//	             operation."
//	BULK         "Background work, expect these to be routinely shed."
//
// A request that carries no priority is Critical, following Google's default
// criticality (Site Reliability Engineering, chapter 21, "Criticality"), so
// a user who tags nothing gets a classic, priority-blind gate.
//
// # Names
//
// [Priority.String] gives each bucket's name in snake_case, the form the
// metrics carry: critical, degraded, best_effort, bulk. [ParsePriority],
// which reads the priority header, accepts more: a name in any ASCII case,
// its words joined by nothing or by any run of '-' and '_', with
// surrounding white space trimmed. So BEST_EFFORT (Netflix's spelling),
// best_effort, best-effort, Best-Effort, BestEffort, besteffort and even
// best-_effort are all BestEffort, and CRITICAL, Degraded and bulk parse
// too. Separators count only between words: "bulk_" and "crit-ical" are
// errors. A space is not a separator: "best effort" is an error. Anything
// else is an error too; the transport counts such a header as malformed
// and treats the call as Critical.
//
// # Shedding bottom-up
//
// A gate that must refuse some fraction of its traffic (the throttler's
// rejection probability, the limiter's queue fill) refuses it bottom-up:
// Bulk first, then BestEffort, then Degraded, using the recent traffic mix
// per bucket to know how much each can give, and Critical only when every
// lower bucket is already fully shed or the gate would refuse everything
// anyway. [Split] is that rule, as a pure function; the gates keep the
// windowed counts it needs. This is the shape of Netflix's progressive
// shedding, and of the rule in Google's SRE book (chapter 21,
// "Criticality") that a backend rejects requests of one criticality only
// once it rejects all requests of every lower one.
package shedding

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Priority is how much a request matters to the people waiting on it. Lower
// values matter more; the zero value is Critical.
type Priority uint8

const (
	// Critical requests affect core functionality. They are never shed
	// unless the gate would refuse everything anyway. Untagged requests are
	// Critical.
	Critical Priority = iota
	// Degraded requests affect user experience; they are shed progressively
	// as load increases.
	Degraded
	// BestEffort requests do not affect the user; they may be shed
	// progressively even in normal operation.
	BestEffort
	// Bulk is background work nobody waits on: routinely shed, never hedged.
	Bulk
)

// NumPriorities is the number of priority buckets, for arrays indexed by
// Priority.
const NumPriorities = 4

var names = [NumPriorities]string{"critical", "degraded", "best_effort", "bulk"}

// String returns the priority's name in snake_case, the form metrics and
// logs carry: "critical", "degraded", "best_effort" or "bulk". A value
// outside the four buckets gives "priority(N)", which ParsePriority
// rejects.
func (p Priority) String() string {
	if p < NumPriorities {
		return names[p]
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

// Valid reports whether p is one of the four buckets.
func (p Priority) Valid() bool { return p < NumPriorities }

// ParsePriority parses a priority name. It accepts each name in String's
// form or the Go constant's, in any ASCII case, with its words joined by
// nothing or by any run of '-' and '_', and ignores surrounding white space:
// "best_effort", "BEST_EFFORT", "best-effort", "BestEffort" and "besteffort"
// all give BestEffort. Anything else is an error, and gives Critical, the
// priority of an untagged request. It allocates only for an error.
func ParsePriority(s string) (Priority, error) {
	t := strings.TrimSpace(s)
	for i, n := range names {
		if spells(t, n) {
			return Priority(i), nil
		}
	}
	if len(t) > maxQuoted {
		// The error quotes what it was given, and a header may be a
		// megabyte: no more than a name's worth.
		t = t[:maxQuoted] + "..."
	}
	return Critical, fmt.Errorf("shedding: unknown priority %q (want critical, degraded, best_effort or bulk)", t)
}

// maxQuoted bounds the bytes of a value ParsePriority's error quotes.
const maxQuoted = 64

// spells reports whether s spells name, a lower-case ASCII name whose words
// are joined by '-' or '_': the same letters in any ASCII case, with each
// separator of name standing for any run of '-' and '_' in s, even an empty
// one. It compares byte by byte, so it allocates nothing, and folds ASCII
// case only: the Kelvin sign is not a k here, as it is to strings.EqualFold.
func spells(s, name string) bool {
	i := 0
	for j := 0; j < len(name); j++ {
		c := name[j]
		if c == '-' || c == '_' {
			for i < len(s) && (s[i] == '-' || s[i] == '_') {
				i++
			}
			continue
		}
		if i == len(s) || lower(s[i]) != c {
			return false
		}
		i++
	}
	return i == len(s)
}

// lower returns b in lower case if it is an ASCII upper-case letter.
func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}

type priorityKey struct{}

// WithPriority returns a copy of ctx that carries p. A priority in the
// context wins over one in a request header.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the priority carried by ctx and whether there was
// one. Without one it returns Critical, false.
func PriorityFrom(ctx context.Context) (Priority, bool) {
	p, ok := ctx.Value(priorityKey{}).(Priority)
	return p, ok
}
