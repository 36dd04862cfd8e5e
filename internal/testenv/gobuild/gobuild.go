// Package gobuild builds the project's programs for the tests that run them as
// an operator or a developer would (pepsi-dispatch with real workers, pepsi-queue
// and pepsi-ingress end to end, the demo, the bench, the chaos run). It is for
// tests only; it never builds anything outside this module.
package gobuild

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
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
