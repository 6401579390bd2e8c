// Package docs holds resilix's user documentation (the Markdown pages in this
// directory) and the test that compiles every Go snippet in them and in the
// repository's README.md. It is its own module, so that the packages the
// snippets use (otelhttp, go-redis) stay out of resilix's go.mod.
//
// See design.md, "Go snippets in the docs", for the convention a snippet
// follows, and run the test with
//
//	cd docs && go test ./...
package docs
