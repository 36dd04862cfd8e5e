// Package gobuild builds the project's programs for the tests that run them as
// an operator or a developer would (pepsi-dispatch with real workers, pepsi-queue
// and pepsi-ingress end to end, the demo, the bench, the chaos run). It is for
// tests only; it never builds anything outside this module.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// module is the import path every program is named under.
const module = "github.com/pepsi-pipeline/pepsi/"

// Into builds programs, each a folder of this module ("cmd/pepsi-dispatch",
// "tools/pepsi-...", "internal/testenv/teststage"), into dir, each binary
// named for its folder.
func Into(dir string, programs ...string) error {
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, p := range programs {
		args = append(args, module+p)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Programs builds programs (see Into) into a folder of t's own, removed when
// the test ends, and returns the folder. It fails t if they do not build.
func Programs(t testing.TB, programs ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Into(dir, programs...); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Binary is one program built at most once per test binary, for the tests of
// a program that run it many times: its first Path builds it into a folder of
// its own, which Main deletes after the tests.
type Binary struct {
	program string
	once    sync.Once
	dir     string
	err     error
}

// Once returns program (see Into) to be built when a test first asks for it.
func Once(program string) *Binary { return &Binary{program: program} }

// Path returns the built program's path, building it first if no test has;
// it fails t if the program does not build.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	name := path.Base(b.program)
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", name+"-test"); b.err == nil {
			b.err = Into(b.dir, b.program)
		}
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return filepath.Join(b.dir, name)
}

// Main runs m's tests, for TestMain, then deletes the built program (if a
// test built it) and exits with the tests' status.
func (b *Binary) Main(m *testing.M) {
	code := m.Run()
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
	os.Exit(code)
}
