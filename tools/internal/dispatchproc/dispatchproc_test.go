package dispatchproc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

// fakeDispatch writes an executable sh script standing in for pepsi-dispatch:
// it logs its arguments and the variables the test looks for, then runs body.
func fakeDispatch(t *testing.T, body string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), dispatchproc.Name)
	script := "#!/bin/sh\necho \"args: $*\"\nenv | grep -E '^(PEPSI_|PGX_TEST|EXTRA)' | sort\n" + body + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func start(t *testing.T, c dispatchproc.Config) *dispatchproc.Process {
	t.Helper()
	c.Log = filepath.Join(t.TempDir(), "dispatch.log")
	p, err := dispatchproc.Start(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// waitLog waits until the log holds want, so that a signal sent next finds
// the script's trap installed.
func waitLog(t *testing.T, p *dispatchproc.Process, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		text, _ := os.ReadFile(p.Log)
		if strings.Contains(string(text), want) {
			return string(text)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log never held %q:\n%s", want, text)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The dispatcher gets -c CONF and the extra flags, an environment without our
// PEPSI_* variables (nor those of Drop) but with Env, and exits 0 on SIGTERM.
func TestStartPassesConfigurationAndEnvironmentAndStopsOnSIGTERM(t *testing.T) {
	t.Setenv("PEPSI_DATABASE", "postgres://elsewhere/db")
	t.Setenv("PGX_TEST_DROPPED", "1")
	bin := fakeDispatch(t, "trap 'exit 0' TERM\necho ready\nwhile :; do sleep 0.05; done")
	p := start(t, dispatchproc.Config{Binary: bin, Conf: "/x/pepsi.conf", Args: []string{"-standby"},
		Env: []string{"EXTRA=yes", "PEPSI_RUNS=given"}, Drop: []string{"PGX_TEST"}})
	log := waitLog(t, p, "ready")
	for _, want := range []string{"args: -c /x/pepsi.conf -standby\n", "EXTRA=yes\n", "PEPSI_RUNS=given\n"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	for _, unwanted := range []string{"PEPSI_DATABASE", "PGX_TEST_DROPPED"} {
		if strings.Contains(log, unwanted) {
			t.Errorf("the dispatcher saw %s:\n%s", unwanted, log)
		}
	}
	if code := p.ExitCode(); code != -1 {
		t.Errorf("ExitCode while running = %d, want -1", code)
	}
	code, err := p.Stop(10 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("Stop = %d, %v; want 0, nil", code, err)
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done is not closed after Stop returned")
	}
}

// A dispatcher that ignores SIGTERM is killed after the wait, and Stop says so.
func TestStopKillsADispatcherThatIgnoresSIGTERM(t *testing.T) {
	p := start(t, dispatchproc.Config{Binary: fakeDispatch(t, "trap '' TERM\necho ready\nwhile :; do sleep 0.05; done")})
	waitLog(t, p, "ready")
	code, err := p.Stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed it") || code != -1 {
		t.Fatalf("Stop = %d, %v; want -1 and an error saying it was killed", code, err)
	}
	<-p.Done()
}

// A dispatcher that exits by itself closes Done with its status, and its
// log's tail names the file and ends with its last line.
func TestDoneReportsTheExitStatusAndTheLogTail(t *testing.T) {
	p := start(t, dispatchproc.Config{Binary: fakeDispatch(t, "echo one\necho two\nexit 3")})
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatcher did not exit")
	}
	if code := p.ExitCode(); code != 3 {
		t.Errorf("ExitCode = %d, want 3", code)
	}
	tail := p.LogTail(2)
	if !strings.Contains(tail, p.Log) || !strings.HasSuffix(tail, "\none\ntwo") {
		t.Errorf("LogTail(2) = %q; want the file's name, then one and two", tail)
	}
}

// Find takes the given binary as is, else the one on PATH, and otherwise says
// how to get one.
func TestFind(t *testing.T) {
	if got, err := dispatchproc.Find("/given/pepsi-dispatch"); got != "/given/pepsi-dispatch" || err != nil {
		t.Errorf("Find(given) = %q, %v", got, err)
	}
	bin := fakeDispatch(t, "")
	t.Setenv("PATH", filepath.Dir(bin))
	if got, err := dispatchproc.Find(""); got != bin || err != nil {
		t.Errorf("Find(\"\") with it on PATH = %q, %v; want %s", got, err, bin)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := dispatchproc.Find(""); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("Find(\"\") with none = %v; want an error saying to run make build", err)
	}
}
