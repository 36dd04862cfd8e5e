package core_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// allowedImports are the only packages the core may use: none does I/O, reads the
// clock or starts goroutines by itself.
var allowedImports = map[string]bool{
	"bufio": true, "cmp": true, "bytes": true, "encoding/base64": true, "encoding/json": true, "errors": true, "fmt": true, "maps": true, "math": true,
	"slices": true, "sort": true, "strconv": true, "strings": true, "time": true,
	"unicode": true, "unicode/utf8": true,
	"github.com/pepsi-pipeline/pepsi/core":      true,
	"github.com/pepsi-pipeline/pepsi/core/conf": true,
}

// forbiddenTime are the time functions that read the clock or sleep.
var forbiddenTime = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true,
}

// TestCoreIsPure enforces the design card: no I/O, no clock, no goroutines and no
// package-level mutable state anywhere under core/ (test files excepted).
func TestCoreIsPure(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found only %v under core/: the walk is broken", files)
	}
	for _, path := range files {
		violations := checkPure(t, path)
		for _, v := range violations {
			t.Errorf("%s", v)
		}
	}
}

func checkPure(t *testing.T, path string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var bad []string
	report := func(pos token.Pos, format string, args ...any) {
		bad = append(bad, fset.Position(pos).String()+": "+fmt.Sprintf(format, args...))
	}
	timeName := ""
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if !allowedImports[p] {
			report(imp.Pos(), "core imports %q, which may do I/O; only %v are allowed", p, keys(allowedImports))
		}
		if p == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	for _, decl := range f.Decls {
		if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
			report(g.Pos(), "package-level var: the core keeps no global state")
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.GoStmt:
			report(x.Pos(), "go statement: the core starts no goroutines")
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && id.Name == timeName && forbiddenTime[x.Sel.Name] {
				report(x.Pos(), "time.%s reads the clock or sleeps: time comes in as a value", x.Sel.Name)
			}
		}
		return true
	})
	return bad
}

// TestPurityCheckCatchesViolations proves the check above can fail.
func TestPurityCheckCatchesViolations(t *testing.T) {
	dir := t.TempDir()
	src := `package core
import ("os"; "time")
var counter int
func f() { go func() {}(); _ = time.Now(); _ = os.Args }
`
	path := filepath.Join(dir, "bad.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(checkPure(t, path), "\n")
	for _, want := range []string{`imports "os"`, "package-level var", "go statement", "time.Now"} {
		if !strings.Contains(got, want) {
			t.Errorf("purity check missed %q; it reported:\n%s", want, got)
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
