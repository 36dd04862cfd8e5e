package dispatch_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"
)

// The caller's PEPSI_DATABASE and PG* variables must not reach the programs a
// test starts: this package's tests link internal/testenv/hermetic (through
// pgtest), whose init clears them. Without it the stage library's workers take
// PEPSI_DATABASE over their -c file's DATABASE (as they must in production),
// and a test's pipeline runs against the caller's server, or none.
func TestTheCallersDatabaseVariablesDoNotReachTheTestsWorkers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A pipeline of stage-library workers (libstage) and raw ones, run again
	// in a test binary of its own with the variables a user may have exported.
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestStatisticsAreFlushedWhenIdleAndAgreeWithTheQueue$", "-test.count", "1")
	// Run as a caller would: without the marker of a cleared parent.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, hermetic.Marker+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env,
		"PEPSI_DATABASE=postgres://nobody@127.0.0.1:1/elsewhere?connect_timeout=2",
		"PGHOST=127.0.0.1", "PGPORT=1", "PGUSER=nobody", "PGDATABASE=elsewhere", "PGCONNECT_TIMEOUT=2")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the pipeline test with PEPSI_DATABASE and PG* exported: %v\n%s", err, out)
	}
}
