package stage_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// TestMain lets the test binary act as a stage program: with STAGE_TEST_MAIN=1
// it runs stage.Main, so the tests below can check its command line, exit codes
// and configuration handling on a real process.
func TestMain(m *testing.M) {
	if os.Getenv("STAGE_TEST_MAIN") == "1" {
		stage.Main(map[string]stage.Handler{
			"parse": advanceTo("enrich"),
			"enrich": func(_ context.Context, m *stage.Message) stage.Result {
				m.State["enriched"] = true
				return stage.Advance("tag")
			},
			"tag": advanceTo("deliver"),
		}, stage.Fuse("tag"))
	}
	os.Exit(m.Run())
}

// runMain runs the test binary as a stage program and returns its exit code,
// standard output and standard error.
func runMain(t *testing.T, stdin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), answerWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	// The program sees only the PEPSI_* variables a test sets.
	cmd.Env = withoutEnv(withoutEnv(os.Environ(), "PEPSI_DATABASE"), "PEPSI_STAGE")
	cmd.Env = append(append(cmd.Env, "STAGE_TEST_MAIN=1"), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("run stage program: %v", err)
	return 0, "", ""
}

func withoutEnv(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func writeConf(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMainRejectsABadCommandLineWithUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"serve"}, {"worker", "-x"}, {"worker", "-c"}} {
		code, _, stderr := runMain(t, "", []string{"PEPSI_STAGE=parse"}, args...)
		if code != 2 || !strings.Contains(stderr, "usage:") || !strings.Contains(stderr, "enrich, parse, tag") {
			t.Errorf("args %q: exit %d, stderr %q; want exit 2 and a usage naming the stages", args, code, stderr)
		}
	}
}

func TestMainRejectsAMissingOrUnknownStage(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runMain(t, "1\n", nil, "worker")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "PEPSI_STAGE is not set") {
		t.Errorf("no PEPSI_STAGE: exit %d, stdout %q, stderr %q; want exit 2, no answer, and the reason", code, stdout, stderr)
	}
	code, stdout, stderr = runMain(t, "1\n", []string{"PEPSI_STAGE=audit"}, "worker")
	if code != 2 || stdout != "" || !strings.Contains(stderr, `PEPSI_STAGE=\"audit\" has no handler`) {
		t.Errorf("PEPSI_STAGE=audit: exit %d, stdout %q, stderr %q; want exit 2, no answer, and the reason", code, stdout, stderr)
	}
}

func TestMainReadsTheDatabaseFromTheConfigurationAndServes(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "enrich", "a", "b")
	file := writeConf(t, "[pepsi]\nDATABASE = "+url+"\n[stage-enrich]\nPROGRAM = x\n")

	code, stdout, stderr := runMain(t, idLines(ids), []string{"PEPSI_STAGE=enrich"}, "worker", "-c", file)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q; want 0 at the end of input", code, stderr)
	}
	line := `0 >deliver tag:\d+ \{"enriched":true\}`
	if !regexp.MustCompile(`^` + line + `\n` + line + `\n$`).MatchString(stdout) {
		t.Errorf("stdout %q, want two lines matching %q (tag is fused)", stdout, line)
	}
}

func TestMainEnvironmentDatabaseOverridesTheConfiguration(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "a")
	file := writeConf(t, "[pepsi]\nDATABASE = postgres://nobody@127.0.0.1:1/nothing\n")

	code, stdout, stderr := runMain(t, idLines(ids), []string{"PEPSI_STAGE=parse", "PEPSI_DATABASE=" + url}, "worker", "-c="+file)
	if code != 0 || stdout != "0 >enrich\n" {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 0 and \"0 >enrich\"", code, stdout, stderr)
	}
}

func TestMainReportsBadConfigurationAndUnreachableDatabase(t *testing.T) {
	t.Parallel()
	bad := writeConf(t, "[pepsi]\nDATABSE = x\n")
	code, _, stderr := runMain(t, "1\n", []string{"PEPSI_STAGE=parse"}, "worker", "-c", bad)
	if code != 2 || !strings.Contains(stderr, bad+":2: DATABSE: unknown key") {
		t.Errorf("bad configuration: exit %d, stderr %q; want exit 2 naming file:line:key", code, stderr)
	}
	start := time.Now()
	code, stdout, stderr := runMain(t, "1\n", []string{"PEPSI_STAGE=parse", "PEPSI_DATABASE=postgres://postgres@127.0.0.1:1/nothing?connect_timeout=2"}, "worker")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("unreachable database: exit %d, stdout %q, stderr %q; want exit 1, no answer, the host named", code, stdout, stderr)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("unreachable database took %v to report; the dispatcher needs a prompt exit", time.Since(start))
	}
}
