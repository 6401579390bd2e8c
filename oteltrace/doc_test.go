package oteltrace_test

import (
	"os"
	"strings"
	"testing"

	"github.com/resilix/resilix/policy"
)

// TestDocListsEveryReason: the package doc's lists of resilix.hedge.reason
// and resilix.retry.reason values hold every name of policy.SuppressReason
// and policy.SkipReason, so that a reason the policy package gains is not
// left out of the doc.
func TestDocListsEveryReason(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, c := range []struct {
		attr, typ string
		names     func(int) (string, bool)
	}{
		{"resilix.hedge.reason", "policy.SuppressReason", func(i int) (string, bool) {
			s := policy.SuppressReason(i).String()
			return s, !strings.HasPrefix(s, "suppress_reason(")
		}},
		{"resilix.retry.reason", "policy.SkipReason", func(i int) (string, bool) {
			s := policy.SkipReason(i).String()
			return s, !strings.HasPrefix(s, "skip_reason(")
		}},
	} {
		list := listed(t, doc, "//   - "+c.attr+":", "("+c.typ+")")
		for i := 1; ; i++ {
			name, ok := c.names(i)
			if !ok {
				break
			}
			if !list[name] {
				t.Errorf("the doc's %s values lack %s (%s %d)", c.attr, name, c.typ, i)
			}
		}
	}
}

// listed returns the words of doc between from and to, commas, "or" and
// comment markers left out.
func listed(t *testing.T, doc, from, to string) map[string]bool {
	t.Helper()
	_, rest, ok := strings.Cut(doc, from)
	if !ok {
		t.Fatalf("the doc has no %q", from)
	}
	list, _, ok := strings.Cut(rest, to)
	if !ok {
		t.Fatalf("the doc has no %q after %q", to, from)
	}
	words := map[string]bool{}
	for _, w := range strings.Fields(strings.NewReplacer("//", " ", ",", " ").Replace(list)) {
		if w != "or" {
			words[w] = true
		}
	}
	return words
}
