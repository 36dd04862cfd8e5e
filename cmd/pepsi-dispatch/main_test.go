package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// A configuration that parses; the tests below stop before the database.
func writeConf(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := os.WriteFile(file, []byte("[pepsi]\nDATABASE = postgres://127.0.0.1:1/none\n[stage-a]\nPROGRAM = /bin/cat\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestAMistypedFlagIsOneLineAndAPointerToTheHelp(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"-max-runtme", "5s"}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage {
		t.Errorf("exit %d, want %d", code, dispatch.ExitUsage)
	}
	want := "pepsi-dispatch: flag provided but not defined: -max-runtme\nRun 'pepsi-dispatch -h' for help.\n"
	if stderr.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), want)
	}
	stderr.Reset()
	var stdout bytes.Buffer
	if code := run([]string{"-h"}, &stdout, &stderr, signals{}); code != 0 || !strings.Contains(stdout.String(), "Usage: pepsi-dispatch [flags]") ||
		!strings.Contains(stdout.String(), "-worker-idle-timeout") || stderr.Len() != 0 {
		t.Errorf("-h: exit %d, stdout %q, stderr %q; want 0 and the whole help on stdout", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"-version"}, &stdout, &stderr, signals{}); code != 0 || !strings.HasPrefix(stdout.String(), "pepsi-dispatch ") || stderr.Len() != 0 {
		t.Errorf("-version: exit %d, stdout %q, stderr %q; want 0 and the version on stdout", code, stdout.String(), stderr.String())
	}
}

func TestABadValueIsBlamedOnWhereItWasSet(t *testing.T) {
	file := writeConf(t)
	t.Setenv("PEPSI_MAX_RUNTIME", "-5s")
	var stderr bytes.Buffer
	if code := run([]string{"-c", file}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage ||
		!strings.Contains(stderr.String(), `msg="bad value" setting=PEPSI_MAX_RUNTIME err="'-5s' must be positive"`) {
		t.Errorf("PEPSI_MAX_RUNTIME=-5s: exit %d, stderr %q; want %d and the variable named", code, stderr.String(), dispatch.ExitUsage)
	}
	stderr.Reset()
	if code := run([]string{"-c", file, "-max-runtime", "-7s"}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage ||
		!strings.Contains(stderr.String(), `msg="bad value" setting=-max-runtime err="'-7s' must be positive"`) {
		t.Errorf("-max-runtime -7s over the environment: exit %d, stderr %q; want %d and the flag named", code, stderr.String(), dispatch.ExitUsage)
	}
	stderr.Reset()
	if code := run([]string{"-c", file, "-max-runtime", "7s", "-poll-interval", "1ns"}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage ||
		!strings.Contains(stderr.String(), `msg="bad value" setting=-poll-interval err="'1ns' is too short (at least 10ms`) {
		t.Errorf("-poll-interval 1ns: exit %d, stderr %q; want %d and the floor named", code, stderr.String(), dispatch.ExitUsage)
	}
	t.Setenv("PEPSI_LOG_LEVEL", "loud")
	stderr.Reset()
	want := "pepsi-dispatch: PEPSI_LOG_LEVEL \"loud\": want debug, info, warn or error\nRun 'pepsi-dispatch -h' for help.\n"
	if code := run([]string{"-c", file}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage || stderr.String() != want {
		t.Errorf("PEPSI_LOG_LEVEL=loud: exit %d, stderr %q; want %d and %q", code, stderr.String(), dispatch.ExitUsage, want)
	}
}

// An application_name in DATABASE that PostgreSQL would cut or rewrite is a
// usage error before any connection: the dispatcher finds its own sessions by
// it, and would otherwise miss them (a session in doubt it must end, its own
// earlier lock session).
func TestAnApplicationNamePostgreSQLWouldCutIsRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pepsi.conf")
	long := strings.Repeat("n", 64)
	conf := "[pepsi]\nDATABASE = postgres://127.0.0.1:1/none?application_name=" + long + "\n[stage-a]\nPROGRAM = /bin/cat\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := run([]string{"-c", file}, io.Discard, &stderr, signals{}); code != dispatch.ExitUsage ||
		!strings.Contains(stderr.String(), "is 64 bytes; PostgreSQL keeps at most 63") {
		t.Errorf("a 64-byte application_name: exit %d, stderr %q; want %d and the reason", code, stderr.String(), dispatch.ExitUsage)
	}
}

// Proves: with traces on, the dispatcher gives the exporter a processor
// beside the loop's and collects less often, unless GOMAXPROCS or GOGC in
// the environment say otherwise.
func TestTracesGetAProcessorOfTheirOwnUnlessTheEnvironmentSays(t *testing.T) {
	procs, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs); debug.SetGCPercent(gc) })
	for _, k := range []string{"GOMAXPROCS", "GOGC"} {
		if v, set := os.LookupEnv(k); set {
			os.Unsetenv(k)
			t.Cleanup(func() { os.Setenv(k, v) })
		}
	}
	runtime.GOMAXPROCS(1)
	if p, g := tuneForTraces(); p != min(2, runtime.NumCPU()) || g != "400" || debug.SetGCPercent(100) != tracesGCPercent {
		t.Errorf("tuneForTraces() = %d processors, GOGC %s; want %d and 400", p, g, min(2, runtime.NumCPU()))
	}
	t.Setenv("GOMAXPROCS", "1")
	t.Setenv("GOGC", "50")
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(50)
	if p, g := tuneForTraces(); p != 1 || g != "50" || debug.SetGCPercent(50) != 50 {
		t.Errorf("tuneForTraces() with GOMAXPROCS=1 GOGC=50 = %d processors, GOGC %s; want the environment's", p, g)
	}
}

// TestWorkersAreHandedTheConfigurationByAnAbsolutePath: a configuration
// named relative to the working directory reaches the workers (CONFIG_FILE's
// default) as an absolute path, so that they do not depend on where they
// run; a CONFIG_FILE the file sets is handed on as written.
func TestWorkersAreHandedTheConfigurationByAnAbsolutePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("pepsi.conf", []byte("[stage-a]\nPROGRAM = /bin/cat\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg, ok := configure(log, "pepsi.conf", overrides{}, func(f string) string { return f })
	if want := filepath.Join(dir, "pepsi.conf"); !ok || cfg.Dispatch.ConfigFile != want {
		t.Fatalf("CONFIG_FILE of a relative -c: %v, %q; want %q", ok, cfg.Dispatch.ConfigFile, want)
	}
	if err := os.WriteFile("set.conf", []byte("[pepsi-dispatch]\nCONFIG_FILE = etc/pepsi.conf\n[stage-a]\nPROGRAM = /bin/cat\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, ok := configure(log, "set.conf", overrides{}, func(f string) string { return f }); !ok || cfg.Dispatch.ConfigFile != "etc/pepsi.conf" {
		t.Errorf("a CONFIG_FILE the file sets: %v, %q; want it as written", ok, cfg.Dispatch.ConfigFile)
	}
	// Even when it names the file itself, as the dispatcher was given it.
	if err := os.WriteFile("self.conf", []byte("[pepsi-dispatch]\nCONFIG_FILE = self.conf\n[stage-a]\nPROGRAM = /bin/cat\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, ok := configure(log, "self.conf", overrides{}, func(f string) string { return f }); !ok || cfg.Dispatch.ConfigFile != "self.conf" {
		t.Errorf("a CONFIG_FILE the file sets to its own name: %v, %q; want it as written", ok, cfg.Dispatch.ConfigFile)
	}
}

// Proves: a -c the workers cannot read as the dispatcher read it is a usage
// error unless the file sets CONFIG_FILE. A descriptor of the dispatcher's
// own (-c /dev/stdin, /dev/fd/N) names the worker's own descriptor in the
// worker, whose standard input is its messages: a stage of the Go library
// read them as its configuration, answered nothing, and every message
// timed out at MAX_RUNTIME. A named pipe gives each reader what one writer
// wrote, or waits for a writer.
func TestAConfigurationTheWorkersCannotReadIsRefused(t *testing.T) {
	dir := t.TempDir()
	text := "[stage-a]\nPROGRAM = /bin/cat\n"
	file := filepath.Join(dir, "pepsi.conf")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	same := func(f string) string { return f }
	fd := fmt.Sprintf("/dev/fd/%d", f.Fd())
	if _, ok := configure(log, fd, overrides{}, same); ok || !strings.Contains(logs.String(), "names a file descriptor of pepsi-dispatch") {
		t.Errorf("-c %s: configure = %v, log %q; want it refused, saying why", fd, ok, logs.String())
	}
	fifo := filepath.Join(dir, "fifo.conf")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() { _ = os.WriteFile(fifo, []byte(text), 0o600) }()
	logs.Reset()
	if _, ok := configure(log, fifo, overrides{}, same); ok || !strings.Contains(logs.String(), "it is a named pipe, not a regular file") {
		t.Errorf("-c on a named pipe: configure = %v, log %q; want it refused, saying why", ok, logs.String())
	}
	// A CONFIG_FILE the file sets is what the workers read: allowed.
	if err := os.WriteFile(file, []byte("[pepsi-dispatch]\nCONFIG_FILE = "+file+"\n"+text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if cfg, ok := configure(log, fd, overrides{}, same); !ok || cfg.Dispatch.ConfigFile != file {
		t.Errorf("-c %s with CONFIG_FILE set: configure = %v, log %q; want it accepted", fd, ok, logs.String())
	}
}
