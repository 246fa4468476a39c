package validate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// Binary is a built dhtkv and what its -h says.
type Binary struct {
	Path string
	// Flags are its flags' names (without dashes) and the default -h
	// states for each ("" where it states none).
	Flags map[string]string
}

// BuildBinary builds cmd/dhtkv of the repository at root into dir, as
// testcluster.BuildBinary does (the same command, so the go command's
// cache serves either), and reads its flags from -h.
func BuildBinary(root, dir string) (*Binary, error) {
	path := filepath.Join(dir, "dhtkv")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/dhtkv")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/dhtkv: %v\n%s", err, out)
	}
	out, err := exec.Command(path, "-h").Output()
	if err != nil {
		return nil, fmt.Errorf("dhtkv -h: %w", err)
	}
	b := &Binary{Path: path, Flags: parseHelp(out)}
	if len(b.Flags) < 10 {
		return nil, fmt.Errorf("dhtkv -h lists %d flags:\n%s", len(b.Flags), out)
	}
	return b, nil
}

var (
	helpFlag    = regexp.MustCompile(`^  -([a-z0-9-]+)`)
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
)

// parseHelp reads the flags and their defaults from the flag package's
// PrintDefaults layout: "  -name type" lines, then indented usage lines,
// the last ending in "(default X)" where there is one.
func parseHelp(out []byte) map[string]string {
	flags := map[string]string{}
	var last string
	for _, line := range bytes.Split(out, []byte("\n")) {
		if m := helpFlag.FindSubmatch(line); m != nil {
			last = string(m[1])
			flags[last] = ""
		} else if m := helpDefault.FindSubmatch(line); m != nil && last != "" {
			flags[last] = string(bytes.Trim(m[1], `"`))
		}
	}
	return flags
}

// Parses runs the binary with args and env (and nothing else of this
// process's environment) and --version last: it parses every flag from
// the command line, the DHTKV_ variables and the --config file, then
// prints its version without starting a node. A flag it does not know
// or a value its type does not accept exits 2 with the reason, returned
// here; the checks across flags (node.Config.Validate, --log-format)
// come after --version's exit, and TestManifestsStartANode makes them by
// starting a node. The Go runtime reads GOMEMLIMIT and GOMAXPROCS at
// start and refuses values it cannot parse.
func (b *Binary) Parses(args, env []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Path, append(append([]string{}, args...), "--version")...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("dhtkv refuses the configuration (exit %d): %s", ee.ExitCode(), bytes.TrimSpace(out))
		}
		return fmt.Errorf("dhtkv --version: %w", err)
	}
	return nil
}

// writeTemp writes content into a new file in dir, mode 0600.
func writeTemp(dir, name, content string) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(content), 0o600)
}
