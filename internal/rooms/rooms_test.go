// Package rooms_test checks that the repository's rooms keep their arrows
// pointing down (README.md, "Layout: where things live"): what an operator
// installs (cmd/) and the product's libraries (store/, shell/, httpd/, ingress/,
// queueadmin/, stage/, the shared helpers of internal/, core/) never
// depend on the development programs (tools/), the examples or the test
// infrastructure (internal/testenv/). It holds only this test.
package rooms_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/pepsi-pipeline/pepsi/"

// forbidden are the rooms the product must not depend on.
var forbidden = []string{module + "tools/", module + "examples/", module + "internal/testenv/"}

func TestProductDependsOnNoToolNorTestInfrastructure(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`,
		module+"cmd/...", module+"store/...", module+"shell/...", module+"httpd/...", module+"ingress/...",
		module+"queueadmin/...", module+"stage/...", module+"core/...",
		module+"internal/buildinfo", module+"internal/cliflags", module+"internal/logflags",
		module+"internal/pgnet", module+"internal/msgjson").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	packages := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		packages++
		for _, dep := range fields[1:] {
			for _, room := range forbidden {
				if strings.HasPrefix(dep, room) {
					t.Errorf("%s depends on %s (rooms: %v are for development and tests only)", fields[0], dep, forbidden)
				}
			}
		}
	}
	if packages < 20 {
		t.Fatalf("go list named %d packages; want every package of the product:\n%s", packages, out)
	}
}
