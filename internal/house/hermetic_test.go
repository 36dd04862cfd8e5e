package house

import (
	"os/exec"
	"strings"
	"testing"

	_ "github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"
)

// hermeticPkg is the package whose init clears the PG* and PEPSI_* variables a
// caller exported from a test binary.
const hermeticPkg = "github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"

// TestEveryTestBinaryClearsTheCallersDatabaseVariables fails for any test
// binary of the module that does not link internal/testenv/hermetic, directly
// or through pgtest: run with PEPSI_DATABASE (or PGHOST, PEPSI_LOG_FORMAT, ...)
// exported, its tests, and the programs and workers they start, would take the
// caller's settings over their own.
func TestEveryTestBinaryClearsTheCallersDatabaseVariables(t *testing.T) {
	cmd := exec.Command("go", "list", "-test", "-f", `{{if and (not .ForTest) (eq .Name "main")}}{{.ImportPath}} {{join .Deps " "}}{{end}}`, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -test ./...: %v", err)
	}
	binaries := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, deps, _ := strings.Cut(line, " ")
		if !strings.HasSuffix(name, ".test") {
			continue
		}
		binaries++
		if !strings.Contains(" "+deps+" ", " "+hermeticPkg+" ") {
			t.Errorf("%s does not link %s: import it (for its init) in one of the package's tests", name, hermeticPkg)
		}
	}
	if binaries < 20 {
		t.Fatalf("go list found only %d test binaries: the listing is broken", binaries)
	}
}
