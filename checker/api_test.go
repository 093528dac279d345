package checker

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestAPISpeaksOwnTypes: what package checker exports names only its own types, checker/rules,
// the standard library and the client types a caller already has (go-redis, OpenTelemetry):
// no internal package, which a program outside this module cannot import, and no generated
// wire type, which is the transports' business. It reads the package's exported declarations
// (ast): the types of exported fields, parameters, results, methods and explicitly typed
// variables. A value is no type: ErrIdempotencyConflict is an error equal to the store's.
// The aliases of engineAliases are the one exception: each gives a program outside the module
// its name for a type the engine hands on as it is (a bucket's limit and result, its layout,
// the one field error), so that no twin is kept equal by hand and converted.
func TestAPISpeaksOwnTypes(t *testing.T) {
	t.Parallel()
	allowed := []string{"github.com/quotaflow/quotaflow/checker/rules", "github.com/redis/go-redis/v9",
		"go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		imports := map[string]string{} // the name a file refers to an import by → its path
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			ref := path[strings.LastIndex(path, "/")+1:]
			if strings.HasPrefix(ref, "v") && strings.Trim(ref[1:], "0123456789") == "" {
				ref = filepath.Base(filepath.Dir(path)) // github.com/redis/go-redis/v9 is redis
				ref = strings.TrimPrefix(ref, "go-")
			}
			if imp.Name != nil {
				ref = imp.Name.Name
			}
			imports[ref] = path
		}
		for _, expr := range exportedTypes(f) {
			checked++
			ast.Inspect(expr, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				path, ok := imports[id.Name]
				if !ok {
					t.Errorf("%s: %s.%s: package %s not among the file's imports", fset.Position(sel.Pos()), id.Name, sel.Sel.Name, id.Name)
					return false
				}
				if strings.Contains(path, ".") && !slices.Contains(allowed, path) {
					t.Errorf("%s: the exported API names %s.%s, of package %s: define the type in checker (or checker/rules) and translate",
						fset.Position(sel.Pos()), id.Name, sel.Sel.Name, path)
				}
				return false
			})
		}
	}
	if checked < 50 {
		t.Fatalf("read %d exported type expressions; the package exports far more: the test reads the wrong files", checked)
	}
}

// engineAliases are the exported aliases of internal types, by name: what each stands for.
var engineAliases = map[string]string{
	"Limit":        "bucket.Limit",
	"LimitResult":  "bucket.LimitResult",
	"BucketLayout": "bucket.Layout",
	"FieldError":   "field.Error",
}

// exportedTypes returns the type expressions of f's exported API: exported types (their
// exported fields and interface methods), exported functions and the methods of exported types
// (receiver excluded), and the declared types of exported variables and constants.
func exportedTypes(f *ast.File) []ast.Expr {
	var out []ast.Expr
	fieldTypes := func(fl *ast.FieldList, all bool) {
		if fl == nil {
			return
		}
		for _, fd := range fl.List {
			exported := all || len(fd.Names) == 0 && embeddedExported(fd.Type)
			for _, n := range fd.Names {
				exported = exported || n.IsExported()
			}
			if exported {
				out = append(out, fd.Type)
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Recv != nil && !embeddedExported(d.Recv.List[0].Type) {
				continue
			}
			fieldTypes(d.Type.Params, true)
			fieldTypes(d.Type.Results, true)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if sel, ok := s.Type.(*ast.SelectorExpr); ok && s.Assign.IsValid() {
						if x, ok := sel.X.(*ast.Ident); ok && engineAliases[s.Name.Name] == x.Name+"."+sel.Sel.Name {
							continue
						}
					}
					switch typ := s.Type.(type) {
					case *ast.StructType:
						fieldTypes(typ.Fields, false)
					case *ast.InterfaceType:
						for _, m := range typ.Methods.List {
							out = append(out, m.Type)
						}
					default:
						out = append(out, typ)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && s.Type != nil {
							out = append(out, s.Type)
						}
					}
				}
			}
		}
	}
	return out
}

// embeddedExported reports whether a receiver or embedded field's type names an exported type.
func embeddedExported(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.StarExpr:
		return embeddedExported(e.X)
	case *ast.Ident:
		return e.IsExported()
	case *ast.SelectorExpr:
		return true
	}
	return false
}
