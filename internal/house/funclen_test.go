package house

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// funcLinesMax is the longest a function may be, from its func keyword to its
// closing brace: a reader should see one decision per function, and a
// function longer than a screen rarely holds only one.
const funcLinesMax = 80

// TestNoFunctionIsLongerThanAScreen walks the repository's Go files, except
// tests and the simulator (sim/ has its own, tighter limit), and fails on any
// function longer than funcLinesMax lines.
func TestNoFunctionIsLongerThanAScreen(t *testing.T) {
	root := filepath.Join("..", "..")
	long := map[string]int{}
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "sim" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		files++
		found, err := funcLengths(path)
		if err != nil {
			return err
		}
		for name, n := range found {
			if n > funcLinesMax {
				long[rel+" "+name] = n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("walked only %d Go files from %s: the walk is broken", files, root)
	}
	var names []string
	for name := range long {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Errorf("%s is %d lines, over %d: split it by what each part decides", name, long[name], funcLinesMax)
	}
}

// funcLengths returns the length in lines of every function declared in the
// file at path, by name ("Parse", "(*worker).pass").
func funcLengths(path string) (map[string]int, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	lengths := map[string]int{}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		name := fn.Name.Name
		if fn.Recv != nil && len(fn.Recv.List) == 1 {
			name = fmt.Sprintf("(%s).%s", receiver(fn.Recv.List[0].Type), name)
		}
		lengths[name] = fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
	}
	return lengths, nil
}

// receiver writes a method's receiver type as Go does in a method's full name:
// "*worker", "worker".
func receiver(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return "*" + receiver(x.X)
	case *ast.IndexExpr:
		return receiver(x.X)
	case *ast.IndexListExpr:
		return receiver(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}
