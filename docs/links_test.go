package docs

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// link is a Markdown inline link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped but for hyphens and underscores, spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// outline returns the links and the heading anchors of a Markdown file,
// code blocks left out.
func outline(src []byte) (links []string, anchors map[string]bool) {
	anchors = map[string]bool{}
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			continue
		}
		if h, ok := strings.CutPrefix(line, "#"); ok {
			anchors[slug(strings.TrimSpace(strings.TrimLeft(h, "#")))] = true
		}
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			links = append(links, m[1])
		}
	}
	return links, anchors
}

// TestLinks checks that every relative link of README.md and docs/*.md
// names a file of the repository and, into a Markdown file, one of its
// headings.
func TestLinks(t *testing.T) {
	for _, path := range markdown(t) {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		links, _ := outline(src)
		for _, target := range links {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: a link to %s, which does not exist", relative(path), target)
				continue
			}
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			destSrc, err := os.ReadFile(dest)
			if err != nil {
				t.Fatal(err)
			}
			if _, anchors := outline(destSrc); !anchors[anchor] {
				t.Errorf("%s: a link to %s, whose file has no heading #%s", relative(path), target, anchor)
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Against the peers":                           "against-the-peers",
		"A flaky host is not a dead one: the breaker": "a-flaky-host-is-not-a-dead-one-the-breaker",
		"Go snippets in the docs":                     "go-snippets-in-the-docs",
		"The `admission` handler":                     "the-admission-handler",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
