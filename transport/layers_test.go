package transport

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// layers is the order of the package's files from RoundTrip down to the
// wire: the call, its round, its legs, their lanes, and the helpers below
// them. A file uses names of the files below it, not above. A new file
// goes in this list where it belongs.
var layers = []string{
	"doc.go",
	"call.go",
	"isolate.go",
	"hedge.go",
	"tie.go",
	"leg.go",
	"gates.go",
	"propagate.go",
	"events.go",
	"plan.go",
	"override.go",
	"report.go",
	"transport.go",
	"scope.go",
	"lanes.go",
	"lanepool.go",
	"load.go",
	"alarm.go",
	"body.go",
	"key.go",
}

// maxUpArrows is the most arrows that may run back up the layers.
const maxUpArrows = 8

// TestFilesReadOneWay holds the arrows that run back up to maxUpArrows.
// It counts, between the package's non-test files, an
// arrow from each file to each other file whose names it uses: its
// package-level functions, types, variables and constants, and the
// methods declared in it. An arrow runs back up when it points to a file
// above in layers. It logs the arrows, and the route RoundTrip's static
// call tree takes through the files: each function entered once, in
// source order, depth first; a visit is a stay in one file, and a return
// a visit to a file the route had left.
func TestFilesReadOneWay(t *testing.T) {
	g := loadPackage(t)
	up, total := 0, 0
	var lines []string
	for _, a := range g.arrows() {
		total++
		dir := "down"
		if g.rank[a[1]] < g.rank[a[0]] {
			up++
			dir = "UP"
		}
		lines = append(lines, dir+"\t"+a[0]+" → "+a[1])
	}
	t.Logf("arrows between files:\n%s", strings.Join(lines, "\n"))
	route := g.route("(*transport.Transport).RoundTrip")
	visits, files, returns := routeCounts(route)
	t.Logf("%d arrows, %d back up; RoundTrip's route visits %d files %d times, returning %d times:\n%s",
		total, up, files, visits, returns, strings.Join(route, " → "))
	if up > maxUpArrows {
		t.Errorf("%d arrows run back up, want at most %d", up, maxUpArrows)
	}
}

// pkgGraph is the package's files, their declarations and the uses of
// them, as go/types resolves them.
type pkgGraph struct {
	fset  *token.FileSet
	files map[string]*ast.File
	rank  map[string]int
	info  *types.Info
	pkg   *types.Package
	decls map[*types.Func]*ast.FuncDecl
}

func loadPackage(t *testing.T) *pkgGraph {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	g := &pkgGraph{
		fset:  token.NewFileSet(),
		files: map[string]*ast.File{},
		rank:  map[string]int{},
		decls: map[*types.Func]*ast.FuncDecl{},
	}
	for i, f := range layers {
		g.rank[f] = i
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		if _, ok := g.rank[n]; !ok {
			t.Errorf("%s is not in layers: put it where it belongs", n)
		}
		src, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(g.fset, n, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		g.files[n] = f
		files = append(files, f)
	}
	for _, f := range layers {
		if _, ok := g.files[f]; !ok {
			t.Errorf("layers names %s, which is not in the package", f)
		}
	}
	g.info = &types.Info{
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	// Only the package's own names matter: its imports are read from
	// source, and an error in them (none is expected) only leaves a name
	// of theirs unresolved.
	conf := types.Config{Importer: importer.ForCompiler(g.fset, "source", nil), Error: func(error) {}}
	g.pkg, _ = conf.Check("transport", g.fset, files, g.info)
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if fn, ok := g.info.Defs[fd.Name].(*types.Func); ok {
					g.decls[fn] = fd
				}
			}
		}
	}
	return g
}

// fileOf returns the file declaring obj when obj is one of the package's
// names that count: package-level, or a method; "" otherwise.
func (g *pkgGraph) fileOf(obj types.Object) string {
	if obj == nil || obj.Pkg() != g.pkg || !obj.Pos().IsValid() {
		return ""
	}
	top := obj.Parent() == g.pkg.Scope()
	if fn, ok := obj.(*types.Func); ok && fn.Signature().Recv() != nil {
		top = true
	}
	if !top {
		return ""
	}
	return filepath.Base(g.fset.Position(obj.Pos()).Filename)
}

// arrows returns each pair of files where the first uses names of the
// second, sorted by the layers of both.
func (g *pkgGraph) arrows() [][2]string {
	seen := map[[2]string]bool{}
	for id, obj := range g.info.Uses {
		from := filepath.Base(g.fset.Position(id.Pos()).Filename)
		if to := g.fileOf(obj); to != "" && to != from {
			seen[[2]string{from, to}] = true
		}
	}
	var as [][2]string
	for a := range seen {
		as = append(as, a)
	}
	sort.Slice(as, func(i, j int) bool {
		a, b := as[i], as[j]
		if g.rank[a[0]] != g.rank[b[0]] {
			return g.rank[a[0]] < g.rank[b[0]]
		}
		return g.rank[a[1]] < g.rank[b[1]]
	})
	return as
}

// route walks the static call tree from the method or function whose
// full name (types.Func.FullName) is root: each of the package's
// functions entered once, depth first, its callees (any use of a function
// or method, a call or a value) in source order. It returns the files of
// the functions in the order they are entered, one entry per stay.
func (g *pkgGraph) route(root string) []string {
	var start *types.Func
	for fn := range g.decls {
		if fn.FullName() == root {
			start = fn
		}
	}
	var route []string
	at := func(file string) {
		if len(route) == 0 || route[len(route)-1] != file {
			route = append(route, file)
		}
	}
	entered := map[*types.Func]bool{}
	var walk func(fn *types.Func)
	walk = func(fn *types.Func) {
		entered[fn] = true
		fd := g.decls[fn]
		file := filepath.Base(g.fset.Position(fd.Pos()).Filename)
		at(file)
		if fd.Body == nil {
			return
		}
		var callees []*types.Func
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			if callee, ok := g.info.Uses[id].(*types.Func); ok {
				if _, local := g.decls[callee]; local && !slices.Contains(callees, callee) {
					callees = append(callees, callee)
				}
			}
			return true
		})
		for _, c := range callees {
			if !entered[c] {
				walk(c)
			}
		}
	}
	if start != nil {
		walk(start)
	}
	return route
}

// routeCounts returns how many stays a route makes, in how many files,
// and how many of the stays return to a file it had left.
func routeCounts(route []string) (visits, files, returns int) {
	seen := map[string]bool{}
	for _, f := range route {
		if seen[f] {
			returns++
		}
		seen[f] = true
	}
	return len(route), len(seen), returns
}
