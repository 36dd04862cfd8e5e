package httpd_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// rulesDir holds the example alerting rules and their promtool unit tests.
const rulesDir = "../examples/prometheus"

// promtool finds Prometheus's promtool; .ci/promtool-up installs Debian's
// prometheus package, which carries it, for make test.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("no promtool on PATH for the alerting rules' test: run .ci/promtool-up (apt-get install --no-install-recommends prometheus)")
	}
	return path
}

// runPromtool runs promtool with args in dir and fails the test with its
// output if it does not succeed.
func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// The example rules are valid, and their unit tests pass: the stage health
// alert fires on a stage that cannot start or keeps crashing, and the
// backlog alert on the messages that stage leaves waiting.
func TestTheExampleAlertingRulesPassPromtool(t *testing.T) {
	t.Parallel()
	runPromtool(t, rulesDir, "check", "rules", "pepsi.rules.yml")
	runPromtool(t, rulesDir, "test", "rules", "pepsi.rules.test.yml")
}

// docs/operations.md shows the rules file as it is.
func TestOperationsShowsTheExampleRulesAsTheyAre(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(filepath.Join(rulesDir, "pepsi.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimRight(string(rules), "\n"), "\n") {
		if line != "" {
			line = "    " + line
		}
		indented.WriteString(line + "\n")
	}
	if !strings.Contains(string(doc), indented.String()) {
		t.Errorf("docs/operations.md does not show %s as it is (indented 4 spaces):\n%s", filepath.Join(rulesDir, "pepsi.rules.yml"), indented.String())
	}
}
