package dispatch_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The pepsi-dispatch command: its exit codes and its usage, run as a process.

// command returns pepsi-dispatch with args, in the test's environment less any
// PEPSI_* and PG* variable, with stderr collected.
func command(ctx context.Context, args ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pepsi-dispatch"), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") && !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	return cmd, &stderr
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("run pepsi-dispatch: %v", err)
	return -1
}

func TestBinaryRejectsABadConfigurationWithExitTwoNamingFileLineAndKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(path, []byte("[stage-a]\nPROGRAM = x\nPARALLELISM = many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := command(ctx, "-c", path)
	code := exitCode(t, cmd.Run())
	if want := path + ":3: PARALLELISM"; code != 2 || !strings.Contains(out.String(), want) {
		t.Errorf("exit %d, output %q; want exit 2 and a line containing %q", code, out, want)
	}
}

// Proves: a PROGRAM that is a relative path with a slash stops pepsi-dispatch
// at start-up with exit 2 and one line naming the file, line and key, rather
// than starting a stage only when the dispatcher runs in the right directory.
func TestBinaryRefusesARelativeProgramPathWithExitTwo(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(path, []byte("[stage-a]\nPROGRAM = ./stage.py\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := command(ctx, "-c", path)
	code := exitCode(t, cmd.Run())
	want := path + ":2: PROGRAM: './stage.py' is a relative path: a path must be absolute (a bare name is looked up on PATH)"
	if code != 2 || !strings.Contains(out.String(), want) || strings.Count(strings.TrimSpace(out.String()), "\n") != 0 {
		t.Errorf("exit %d, output %q; want exit 2 and one line containing %q", code, out, want)
	}
}

func TestBinaryHelpPrintsUsage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, out := command(ctx, "-h")
	code := exitCode(t, cmd.Run())
	for _, want := range []string{"Usage: pepsi-dispatch", "-standby", "Exit status"} {
		if code != 0 || !strings.Contains(out.String(), want) {
			t.Errorf("-h: exit %d, output %q; want exit 0 and %q", code, out, want)
		}
	}
}

// Proves: SIGHUP neither kills pepsi-dispatch nor stops it: it logs that
// the signal is ignored and keeps dispatching; SIGTERM then stops it cleanly.
func TestBinaryLivesOnSIGHUP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("a", "a=done")
	d := startBinary(t, "dispatcher", e.conf, e.url)
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	d.awaitLog(10*time.Second, "SIGHUP ignored")
	e.insert("a", "a=done")
	e.waitCounts(20*time.Second, map[string]int{"done": 2})
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := d.exited(exitWait); code != 0 {
		t.Errorf("exit %d after SIGHUP, then SIGTERM; want 0", code)
	}
}

func TestBinaryExitsZeroOnSIGTERM(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("a", "a=done")
	d := startBinary(t, "dispatcher", e.conf, e.url)
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := d.exited(exitWait); code != 0 {
		t.Errorf("exit %d after SIGTERM; want 0", code)
	}
}
