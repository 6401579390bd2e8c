package docs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// packages are the names a snippet written as a function body may use
// without importing them: every file such a snippet becomes imports all of
// them. Adding a package here needs it in this module's build list too:
// deps_test.go imports every one that is not in the standard library.
var packages = map[string]string{
	// The standard library.
	"bits":     "math/bits",
	"context":  "context",
	"errors":   "errors",
	"fmt":      "fmt",
	"http":     "net/http",
	"httptest": "net/http/httptest",
	"io":       "io",
	"log":      "log",
	"netip":    "net/netip",
	"os":       "os",
	"slices":   "slices",
	"slog":     "log/slog",
	"strings":  "strings",
	"synctest": "testing/synctest",
	"testing":  "testing",
	"time":     "time",
	"tls":      "crypto/tls",
	"url":      "net/url",
	// resilix.
	"admission":    "github.com/resilix/resilix/admission",
	"attempt":      "github.com/resilix/resilix/attempt",
	"estimator":    "github.com/resilix/resilix/estimator",
	"httptestutil": "github.com/resilix/resilix/httptestutil",
	"otelmetrics":  "github.com/resilix/resilix/otelmetrics",
	"oteltrace":    "github.com/resilix/resilix/oteltrace",
	"policy":       "github.com/resilix/resilix/policy",
	"redisrate":    "github.com/resilix/resilix/redisrate",
	"shedding":     "github.com/resilix/resilix/shedding",
	"slogobserver": "github.com/resilix/resilix/slogobserver",
	"tenant":       "github.com/resilix/resilix/tenant",
	"transport":    "github.com/resilix/resilix/transport",
	// What the snippets show resilix beside.
	"cleanhttp": "github.com/hashicorp/go-cleanhttp",
	"metric":    "go.opentelemetry.io/otel/metric",
	"otelhttp":  "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
	"redis":     "github.com/redis/go-redis/v9",
	"sdkmetric": "go.opentelemetry.io/otel/sdk/metric",
	"trace":     "go.opentelemetry.io/otel/trace",
}

// A snippet is one fenced go block of a Markdown file.
type snippet struct {
	file     string // relative to the repository's root, as errors name it
	line     int    // the line of the block's first line of code
	code     string
	decl     string // the directive's declarations, "" if none
	declLine int
}

// directive is the hidden comment that declares the names a snippet uses
// without declaring them (see design.md, "Go snippets in the docs").
var directive = regexp.MustCompile(`^<!--\s*snippet:(.*?)-->$`)

// markdown lists the files whose snippets are compiled: the repository's
// README.md and every Markdown page of this directory.
func markdown(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no Markdown page in docs/")
	}
	return append([]string{"../README.md"}, pages...)
}

// relative names path as from the repository's root.
func relative(path string) string {
	if rest, ok := strings.CutPrefix(path, "../"); ok {
		return rest
	}
	return "docs/" + path
}

// extract returns the go blocks of a Markdown file, and an error for a
// directive that no go block follows.
func extract(path string, src []byte) ([]snippet, error) {
	name := relative(path)
	var (
		out     []snippet
		errs    []string
		pending *snippet // a directive waiting for its block
		fence   string   // the open fence's indentation, when in a block
		inBlock bool
		isGo    bool
		code    []string
		startAt int
	)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		if !inBlock {
			if lang, ok := strings.CutPrefix(trimmed, "```"); ok {
				inBlock, fence, code, startAt = true, line[:len(line)-len(trimmed)], nil, n+1
				isGo = strings.TrimSpace(lang) == "go"
				if pending != nil && !isGo {
					errs = append(errs, fmt.Sprintf("%s:%d: a snippet directive before a block that is not ```go", name, pending.declLine))
					pending = nil
				}
				continue
			}
			if m := directive.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				if pending != nil {
					errs = append(errs, fmt.Sprintf("%s:%d: a snippet directive with no ```go block after it", name, pending.declLine))
				}
				pending = &snippet{decl: strings.TrimSpace(m[1]), declLine: n}
				continue
			}
			if strings.TrimSpace(line) != "" {
				if pending != nil {
					errs = append(errs, fmt.Sprintf("%s:%d: a snippet directive with no ```go block after it", name, pending.declLine))
					pending = nil
				}
			}
			continue
		}
		if strings.TrimSpace(line) == "```" {
			inBlock = false
			if isGo {
				s := snippet{file: name, line: startAt, code: strings.Join(code, "\n") + "\n"}
				if pending != nil {
					s.decl, s.declLine = pending.decl, pending.declLine
				}
				out = append(out, s)
			}
			pending = nil
			continue
		}
		code = append(code, strings.TrimPrefix(line, fence))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if inBlock {
		errs = append(errs, fmt.Sprintf("%s:%d: a code block never closed", name, startAt-1))
	}
	if pending != nil {
		errs = append(errs, fmt.Sprintf("%s:%d: a snippet directive with no ```go block after it", name, pending.declLine))
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

// wholeFile reports whether a snippet is a Go file of its own: its first
// line that is not a comment or blank is a package clause.
func wholeFile(code string) bool {
	for line := range strings.Lines(code) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "package ")
	}
	return false
}

// source is the Go file a snippet is checked as. A whole file is itself,
// its positions moved to the Markdown's lines; a body becomes a function
// whose parameters are the directive's declarations, in a file that
// imports every name of packages.
func source(s snippet) string {
	var b strings.Builder
	if wholeFile(s.code) {
		fmt.Fprintf(&b, "//line %s:%d\n%s", s.file, s.line, s.code)
		return b.String()
	}
	b.WriteString("package snippet\n\nimport (\n")
	for _, name := range slices.Sorted(maps.Keys(packages)) {
		fmt.Fprintf(&b, "\t%s %q\n", name, packages[name])
	}
	b.WriteString(")\n\nfunc _(\n")
	if s.decl != "" {
		fmt.Fprintf(&b, "//line %s:%d\n%s,\n", s.file, s.declLine, s.decl)
	}
	fmt.Fprintf(&b, ") error {\n//line %s:%d\n%s\n\treturn nil\n}\n", s.file, s.line, s.code)
	return b.String()
}

// exportData asks go list for the compiled export data of paths and
// everything they import, built as this test binary was (with -race or
// without), so that the build cache already holds most of it.
func exportData(t *testing.T, paths []string) map[string]string {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}}\t{{.Export}}{{end}}"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, paths...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	files := make(map[string]string)
	for line := range strings.Lines(string(out)) {
		path, file, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok {
			files[path] = file
		}
	}
	return files
}

// imports lists the import paths of whole-file snippets.
func imports(fset *token.FileSet, s snippet) []string {
	f, err := parser.ParseFile(fset, "snippet.go", source(s), parser.ImportsOnly)
	if err != nil {
		return nil // reported when the snippet is checked
	}
	var paths []string
	for _, spec := range f.Imports {
		if p, err := strconv.Unquote(spec.Path.Value); err == nil {
			paths = append(paths, p)
		}
	}
	return paths
}

// TestSnippetsCompile type-checks every go block of README.md and docs/*.md
// against the packages of this checkout, and fails naming the file and the
// line of each error.
func TestSnippetsCompile(t *testing.T) {
	var all []snippet
	for _, path := range markdown(t) {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := extract(path, src)
		if err != nil {
			t.Error(err)
		}
		all = append(all, got...)
	}
	if len(all) == 0 {
		t.Fatal("no go block found")
	}

	fset := token.NewFileSet()
	need := map[string]bool{}
	for _, p := range packages {
		need[p] = true
	}
	for _, s := range all {
		if wholeFile(s.code) {
			for _, p := range imports(fset, s) {
				need[p] = true
			}
		}
	}
	files := exportData(t, slices.Sorted(maps.Keys(need)))
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q (add it to packages and to deps_test.go)", path)
		}
		return os.Open(file)
	})

	for _, s := range all {
		whole := wholeFile(s.code)
		f, err := parser.ParseFile(fset, "snippet.go", source(s), parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			var list scanner.ErrorList
			if errors.As(err, &list) {
				for _, e := range list {
					t.Errorf("%s", e)
				}
			} else {
				t.Errorf("%s:%d: %v", s.file, s.line, err)
			}
			continue
		}
		var errs []string
		conf := types.Config{
			Importer: imp,
			Error: func(err error) {
				te := err.(types.Error)
				// A body may declare a name only to show it (client :=
				// ...), and imports every package it might use.
				if !whole && strings.Contains(te.Msg, "and not used") {
					return
				}
				errs = append(errs, te.Error())
			},
		}
		pkgName := "snippet"
		if whole {
			pkgName = f.Name.Name
		}
		_, _ = conf.Check(pkgName, fset, []*ast.File{f}, nil)
		for _, e := range errs {
			t.Errorf("%s", e)
		}
	}
	t.Logf("%d go blocks checked", len(all))
}

// TestExtract checks the reading of Markdown the test above relies on.
func TestExtract(t *testing.T) {
	md := strings.Join([]string{
		"# Title",
		"<!-- snippet: ctx context.Context -->",
		"```go",
		"ctx = tenant.With(ctx, \"acme\")",
		"```",
		"- a list item:",
		"  ```go",
		"  x := 1",
		"  ```",
		"```text",
		"not go",
		"```",
		"<!-- snippet: rt *transport.Transport -->",
		"text between",
		"```go",
		"_ = 1",
		"```",
	}, "\n")
	got, err := extract("page.md", []byte(md))
	if err == nil || !strings.Contains(err.Error(), "docs/page.md:13: a snippet directive with no ```go block after it") {
		t.Errorf("extract error = %v, want the dangling directive on line 13", err)
	}
	want := []snippet{
		{file: "docs/page.md", line: 4, code: "ctx = tenant.With(ctx, \"acme\")\n", decl: "ctx context.Context", declLine: 2},
		{file: "docs/page.md", line: 8, code: "x := 1\n"},
		{file: "docs/page.md", line: 16, code: "_ = 1\n"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("extract = %+v\nwant %+v", got, want)
	}
	if !wholeFile("// A program.\npackage main\n") || wholeFile("x := 1\n") {
		t.Error("wholeFile tells a file from a body wrongly")
	}
}
