// Package hermetic keeps a test binary from reaching a server, a database or a
// setting it was not given: imported by a test (pgtest imports it, so every
// test with a database has it), its init removes from the process environment
// every PG* variable (libpq's and pgx's: PGHOST, PGPORT, PGSSLMODE, ...) and
// every PEPSI_* variable except PEPSI_TEST_* (PEPSI_DATABASE, PEPSI_LOG_FORMAT,
// PEPSI_MAX_RUNTIME, ...), and every OTEL_* variable (OpenTelemetry's: an
// exported OTEL_EXPORTER_OTLP_ENDPOINT would make every program a test starts
// export traces), before any test runs. Without it a PEPSI_DATABASE
// the caller exported (as the README invites for the demo) would win over a
// test's own database in every program and worker the test starts, and a
// PGHOST would redirect what a URL leaves out.
//
// The test's server is PEPSI_TEST_DATABASE_URL (kept, as is every PEPSI_TEST_*
// variable: a seed, the server); a test that wants a variable for a program it
// starts sets it on that program. A process whose environment a cleared
// process made (Marker is set: a test binary run again by its own test, as a
// worker, say) is left as it is: its variables are the ones its parent meant
// it to have. Only test code imports this package; it must never be imported
// by a program.
package hermetic

import (
	"os"
	"strings"
)

// Marker is set in the environment of a cleared process, and so of every
// process it starts: such a process keeps its environment.
const Marker = "PEPSI_TEST_HERMETIC"

func init() {
	if os.Getenv(Marker) != "" {
		return
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if foreign(name) {
			if err := os.Unsetenv(name); err != nil {
				panic("hermetic: unset " + name + ": " + err.Error())
			}
		}
	}
	if err := os.Setenv(Marker, "1"); err != nil {
		panic("hermetic: set " + Marker + ": " + err.Error())
	}
}

// foreign reports whether the variable called name is one a test must not
// inherit from its caller: PG*, OTEL_* or PEPSI_* but not PEPSI_TEST_*.
func foreign(name string) bool {
	switch {
	case strings.HasPrefix(name, "PEPSI_TEST_"):
		return false
	case strings.HasPrefix(name, "PEPSI_"), strings.HasPrefix(name, "PG"), strings.HasPrefix(name, "OTEL_"):
		return true
	}
	return false
}
