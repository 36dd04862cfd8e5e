package buildinfo_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/buildinfo"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
)

func TestVersionNamesTheProgramAndTheToolchain(t *testing.T) {
	v := buildinfo.Version("pepsi-dispatch")
	if !strings.HasPrefix(v, "pepsi-dispatch (PEPSI) ") || !strings.HasSuffix(v, runtime.Version()) || strings.Contains(v, "\n") {
		t.Errorf("Version = %q; want one line naming pepsi-dispatch, PEPSI and %s", v, runtime.Version())
	}
}

// Every program (cmd/, tools/pepsi-*, examples/pepsi-example) answers
// -version: one line naming it, exit 0, and nothing else done (no database is
// reachable at the address the environment gives).
func TestEveryProgramAnswersVersion(t *testing.T) {
	t.Parallel()
	var dirs []string
	for _, pattern := range []string{"../../cmd/*/main.go", "../../tools/pepsi-*/main.go", "../../examples/pepsi-example/main.go"} {
		found, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatalf("glob %s: %v", pattern, err)
		}
		dirs = append(dirs, found...)
	}
	if len(dirs) < 11 {
		t.Fatalf("programs found: %v", dirs)
	}
	bin := gobuild.Programs(t, "cmd/...", "tools/pepsi-...", "examples/pepsi-example")
	for _, main := range dirs {
		name := filepath.Base(filepath.Dir(main))
		cmd := exec.Command(filepath.Join(bin, name), "-version")
		cmd.Env = append(os.Environ(), "PEPSI_DATABASE=postgres://nobody@127.0.0.1:1/none", "PGHOST=127.0.0.1", "PGPORT=1")
		text, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(text), name+" (PEPSI) ") || strings.Count(string(text), "\n") != 1 {
			t.Errorf("%s -version: %v, output %q; want exit 0 and one line starting %q", name, err, text, name+" (PEPSI) ")
		}
	}
}
