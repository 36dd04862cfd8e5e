package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestDemoRunsThePipelineToThePredictedEnd builds the programs the demo uses, as
// make demo does, and runs pepsi-demo with 500 messages on the test server: the real
// pepsi-dispatch, pepsi-queue, pepsi-example and audit.sh, end to end.
func TestDemoRunsThePipelineToThePredictedEnd(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "tools/pepsi-demo", "cmd/pepsi-dispatch", "cmd/pepsi-queue", "examples/pepsi-example")
	admin := pgtest.AdminURL(t)
	// A database of this test's own (dropped when the test ends), which the demo
	// drops and creates afresh by name.
	name := pgtest.NewDatabaseName(t)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pepsi-demo"),
		"-n", "500", "-db-name", name, "-testdata", "../../testdata", "-timeout", "2m")
	// The demo keeps its configuration and log for the user to read; in a test
	// they go to the test's own folder, so a run leaves nothing in /tmp.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+bin+string(filepath.ListSeparator)+os.Getenv("PATH"), "PEPSI_DATABASE="+admin, "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("pepsi-demo -n 500: %v; output:\n%s", err, out.String())
	}
	var payloads [][]byte
	for i := 1; i <= 500; i++ {
		payloads = append(payloads, pipeline.Payload(i))
	}
	want := pipeline.Expect(payloads)
	for _, line := range []string{
		"PASS: every message ended where the pipeline's rules say.",
		fmt.Sprintf("ok   done: %d (predicted %d)", want.Done, want.Done),
		fmt.Sprintf("ok   paused once by deliver, then delivered: %d (predicted %d)", want.Paused, want.Paused),
		"ok   failed: 5 (predicted 5",
		"ok   pepsi-dispatch exited with status 0 after SIGTERM",
		"500/500 finished",
		// The database pgtest made exists: the demo says it drops it.
		fmt.Sprintf("database %s already exists (an earlier demo's?): dropping it", name),
		"The configuration and pepsi-dispatch's log are in " + tmp + string(filepath.Separator) + "pepsi-demo-",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("pepsi-demo output lacks %q; output:\n%s", line, out.String())
		}
	}
}
