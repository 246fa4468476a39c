package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMarkdownFences: in every Markdown file of the repository, each
// code fence that opens also closes, and no line inside a fence starts
// with the fence's marker followed by text. CommonMark takes such a line
// (say "``` Flags come before") for more code, not for the fence's end,
// so everything up to the next bare fence renders as one code block: the
// README once swallowed a paragraph, a table and a heading that way.
func TestMarkdownFences(t *testing.T) {
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "data") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, problem := range fenceProblems(string(b)) {
			t.Errorf("%s:%s", path, problem)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fenceProblems lists, as "LINE: what", the fences of a Markdown text
// that do not close as they look as if they did.
func fenceProblems(text string) []string {
	var problems []string
	open, openLine := "", 0 // the opening fence's marker run, and its line
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if len(line)-len(trimmed) > 3 {
			continue // indented code, or a fence's content
		}
		marker := fenceRun(trimmed)
		switch {
		case marker == "":
		case open == "":
			open, openLine = marker, i+1
		case marker[0] == open[0] && len(marker) >= len(open):
			if rest := strings.TrimSpace(trimmed[len(marker):]); rest != "" {
				problems = append(problems, strconv.Itoa(i+1)+": text after the fence that closes line "+strconv.Itoa(openLine)+"'s: "+
					"the fence does not close, and what follows renders as code (put the text on a line of its own)")
			}
			open = ""
		}
	}
	if open != "" {
		problems = append(problems, strconv.Itoa(openLine)+": a fence that never closes")
	}
	return problems
}

// fenceRun is the run of three or more backticks or tildes s starts with,
// or "".
func fenceRun(s string) string {
	if s == "" || (s[0] != '`' && s[0] != '~') {
		return ""
	}
	n := 0
	for n < len(s) && s[n] == s[0] {
		n++
	}
	if n < 3 {
		return ""
	}
	return s[:n]
}
