package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestArchitecture keeps docs/architecture.md true to the code: its
// "## Packages" table names exactly the packages `go list ./...` lists,
// and every name it gives in backticks or in its diagrams exists:
//   - `pkg.Name`: a top-level declaration, or a method of a type, of the
//     module package whose last path element is pkg (other qualifiers,
//     fasthttp or tls, are not checked);
//   - `pkg.Type.Member`, and `Type.Member` for a type some module
//     package declares: a method or field of that type;
//   - a bare exported `Name` in a row of one package: declared there;
//   - `TestX`, `BenchmarkX`: a test function of the module;
//   - `file.go` or `dir/file.go`: a file of the module, in the table one
//     of the row's packages.
//
// A package added, moved or renamed, or a name the document gives
// changed in the code, fails here until the document says so.
func TestArchitecture(t *testing.T) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err, "go env GOMOD")
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	out, err := exec.Command("go", "list", "-C", root, "-f",
		`{{.Dir}}	{{join .GoFiles " "}}	{{join .TestGoFiles " "}} {{join .XTestGoFiles " "}} {{join .IgnoredGoFiles " "}}`, "./...").Output()
	require.NoError(t, err, "go list ./...")
	pkgs := map[string]decls{}        // directory from root → its declarations
	byName := map[string][]string{}   // last path element → directories
	typeDirs := map[string][]string{} // type name → the directories declaring one
	files := map[string][]string{}    // a .go file's base name → its paths from root
	tests := map[string]bool{}        // the test functions of the module
	testFunc := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w*)\(`)
	for line := range strings.Lines(string(out)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		dir, goFiles, others := f[0], strings.Fields(f[1]), strings.Fields(f[2])
		rel, err := filepath.Rel(root, dir)
		require.NoError(t, err)
		rel = filepath.ToSlash(rel)
		pkgs[rel] = parsePackage(t, dir, goFiles)
		byName[filepath.Base(rel)] = append(byName[filepath.Base(rel)], rel)
		for typ := range pkgs[rel] {
			typeDirs[typ] = append(typeDirs[typ], rel)
		}
		for _, name := range slices.Concat(goFiles, others) {
			files[name] = append(files[name], rel+"/"+name)
			if strings.HasSuffix(name, "_test.go") {
				src, err := os.ReadFile(filepath.Join(dir, name))
				require.NoError(t, err)
				for _, m := range testFunc.FindAllStringSubmatch(string(src), -1) {
					tests[m[1]] = true
				}
			}
		}
	}

	const doc = "docs/architecture.md"
	raw, err := os.ReadFile("architecture.md")
	require.NoError(t, err)
	code := regexp.MustCompile("`([^`]+)`")
	word := regexp.MustCompile(`[\w./-]+\.go\b|[A-Za-z_]\w*(\.[A-Za-z_]\w*)+`)
	goName := regexp.MustCompile(`^[A-Za-z_]\w*(\.[A-Za-z_]\w*){0,2}$`)
	// Names of other files, which the diagrams may mention.
	notGo := regexp.MustCompile(`\.(md|sh|pl|lua|json|ya?ml|conf|service|txt|svg)$`)
	table := map[string]int{} // the packages the table names → their row's line
	inTable, fenced := false, false
	for i, line := range strings.Split(string(raw), "\n") {
		at := func(format string, args ...any) {
			t.Errorf("%s:%d: "+format, append([]any{doc, i + 1}, args...)...)
		}
		if strings.HasPrefix(line, "## ") {
			inTable = line == "## Packages"
		}
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		var row []string // the packages of a table row
		spans := line
		if cells := strings.Split(line, "|"); inTable && len(cells) > 2 && strings.Contains(cells[1], "`") {
			for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
				p := strings.TrimSuffix(m[1], "/")
				if strings.HasSuffix(m[1], "/") && len(row) > 0 { // "(+ `sub/`)"
					p = row[len(row)-1] + "/" + p
				}
				row = append(row, p)
				table[p] = i + 1
			}
			spans = strings.Join(cells[2:], "|")
		}
		var names []string
		for _, m := range code.FindAllStringSubmatch(spans, -1) {
			names = append(names, strings.TrimSuffix(m[1], "()"))
		}
		if fenced {
			names = word.FindAllString(line, -1)
		}
		for _, name := range names {
			parts := strings.Split(name, ".")
			dirs := byName[parts[0]] // the packages pkg may be
			inPkg := func(typ, name string) bool {
				return slices.ContainsFunc(dirs, func(dir string) bool { return pkgs[dir].has(typ, name) })
			}
			switch isPkg := len(dirs) > 0; {
			case strings.HasSuffix(name, ".go"):
				var where []string
				for _, p := range files[filepath.Base(name)] {
					if p == name || strings.HasSuffix(p, "/"+name) {
						where = append(where, p)
					}
				}
				if len(where) == 0 {
					at("`%s`: no such file in the module; name the file that holds it now", name)
				} else if len(row) > 0 && !slices.ContainsFunc(where, func(p string) bool { return slices.Contains(row, filepath.ToSlash(filepath.Dir(p))) }) {
					at("`%s` is %s, in none of this row's packages (%s): name it in its own package's row", name, strings.Join(where, ", "), strings.Join(row, ", "))
				}
			case !goName.MatchString(name) || notGo.MatchString(name):
			case len(parts) == 1 && (strings.HasPrefix(name, "Test") || strings.HasPrefix(name, "Benchmark")):
				if !tests[name] {
					at("`%s`: no such test function in the module; name the test that checks it now", name)
				}
			case len(parts) == 1 && len(row) == 1 && ast.IsExported(name):
				if d, ok := pkgs[row[0]]; ok && !d.has("", name) {
					at("`%s`: package %s declares no %s (top-level, or a method); write the name the code has", name, row[0], name)
				}
			case isPkg && len(parts) == 2:
				if !inPkg("", parts[1]) {
					at("`%s`: package %s declares no %s (top-level, or a method of one of its types); write the name the code has", name, strings.Join(dirs, " or "), parts[1])
				}
			case isPkg && len(parts) == 3:
				if !inPkg(parts[1], parts[2]) {
					at("`%s`: package %s has no type %s with a method or field %s; write the name the code has", name, strings.Join(dirs, " or "), parts[1], parts[2])
				}
			case len(parts) == 2 && len(typeDirs[parts[0]]) > 0:
				if !slices.ContainsFunc(typeDirs[parts[0]], func(dir string) bool { return pkgs[dir].has(parts[0], parts[1]) }) {
					at("`%s`: type %s (in %s) has no method or field %s; write the name the code has", name, parts[0], strings.Join(typeDirs[parts[0]], ", "), parts[1])
				}
			}
		}
	}

	var missing, extra []string
	for p := range pkgs {
		if table[p] == 0 {
			missing = append(missing, p)
		}
	}
	for p, line := range table {
		if _, ok := pkgs[p]; !ok {
			extra = append(extra, fmt.Sprintf("%s (line %d)", p, line))
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("%s: the \"## Packages\" table lacks %s, which `go list ./...` lists: add a row \"| `dir` | what it holds |\" (packages may share a row: \"`a`, `b`\")", doc, strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		t.Errorf("%s: the \"## Packages\" table names %s, which `go list ./...` does not list: rename or remove them", doc, strings.Join(extra, ", "))
	}
}

// decls is what a package declares outside its tests: under "" its
// top-level names, under a type's name its methods and fields, and, as
// "*T", each type T it embeds (whose members it promotes).
type decls map[string]map[string]bool

// has reports whether type typ has a method or field name; for typ "",
// whether the package declares name, or one of its types has a method
// name (the document may write `replica.DropPartition` for
// (*replica.Replica).DropPartition).
func (d decls) has(typ, name string) bool {
	if d[typ][name] {
		return true
	}
	if typ == "" {
		return slices.ContainsFunc(slices.Collect(maps.Keys(d)), func(typ string) bool { return typ != "" && d.has(typ, name) })
	}
	for e := range d[typ] {
		if strings.HasPrefix(e, "*") && e[1:] != typ && d.has(e[1:], name) {
			return true
		}
	}
	return false
}

// parsePackage reads the declarations of the package in dir, from its
// non-test files (those `go list` names for this build).
func parsePackage(t *testing.T, dir string, files []string) decls {
	d := decls{"": {}}
	add := func(typ, name string) {
		if d[typ] == nil {
			d[typ] = map[string]bool{}
		}
		d[typ][name] = true
	}
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl: // its body declares nothing of the package's
				if n.Recv == nil {
					add("", n.Name.Name)
				} else {
					add(typeName(n.Recv.List[0].Type), n.Name.Name)
				}
				return false
			case *ast.ValueSpec:
				for _, id := range n.Names {
					add("", id.Name)
				}
			case *ast.TypeSpec:
				add("", n.Name.Name)
				var fields []*ast.Field
				switch tt := n.Type.(type) {
				case *ast.StructType:
					fields = tt.Fields.List
				case *ast.InterfaceType:
					fields = tt.Methods.List
				}
				for _, fl := range fields {
					for _, id := range fl.Names {
						add(n.Name.Name, id.Name)
					}
					if len(fl.Names) == 0 {
						add(n.Name.Name, "*"+typeName(fl.Type))
					}
				}
			}
			return true
		})
	}
	return d
}

// typeName is the name of a receiver's or embedded field's type: T for
// T, *T, T[P] and pkg.T.
func typeName(e ast.Expr) string {
	name, _, _ := strings.Cut(strings.TrimLeft(types.ExprString(e), "*"), "[")
	return name[strings.LastIndex(name, ".")+1:]
}
