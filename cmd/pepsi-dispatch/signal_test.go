package main_test

import (
	"bufio"
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

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
)

// signaled is the signal that ended cmd, which has exited, or 0 when it
// exited by itself.
func signaled(cmd *exec.Cmd) syscall.Signal {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// Proves: a SIGHUP that comes before the dispatcher runs, while it reads
// its configuration (held open here: the file is a named pipe, whose reader
// waits for a writer), does not kill pepsi-dispatch: it was caught only once
// dispatch.Run began, and Go's default for SIGHUP is to exit at once (129).
// It goes on and exits as it would have: 2, the named pipe refused.
func TestASIGHUPBeforeTheDispatcherRunsDoesNotKillIt(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "cmd/pepsi-dispatch")
	fifo := filepath.Join(t.TempDir(), "pepsi.conf")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pepsi-dispatch"), "-c", fifo)
	var out bytes.Buffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The open succeeds once pepsi-dispatch has opened the pipe to read it:
	// past its flags, before its database. (Without a reader it fails with
	// ENXIO, rather than wait for one that may never come.)
	var w *os.File
	for {
		var err error
		if w, err = os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			break
		} else if !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		select {
		case <-exited:
			t.Fatalf("pepsi-dispatch exited before reading its configuration: %s", out.String())
		case <-time.After(time.Millisecond):
		}
	}
	defer w.Close()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatalf("pepsi-dispatch exited on a SIGHUP while reading its configuration (signal %d): %s", signaled(cmd), out.String())
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := w.WriteString("[stage-a]\nPROGRAM = /bin/cat\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	err := <-exited
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if s := signaled(cmd); s != 0 || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(out.String(), "it is a named pipe") {
		t.Errorf("after a SIGHUP while reading its configuration: exit %d, signal %d, output %q; want 2, no signal, the named pipe refused",
			cmd.ProcessState.ExitCode(), s, out.String())
	}
}

// Proves: pepsi-dispatch catches SIGHUP as early as a Go program can: in
// the package initialization, right after os/signal's, before the
// initialization of the packages it imports (OpenTelemetry's, gRPC's,
// Prometheus's: milliseconds in all), in which a SIGHUP would kill it.
// Go initializes packages in a fixed order, which GODEBUG=inittrace shows.
func TestSIGHUPIsCaughtBeforeTheImportedPackagesInitialize(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "cmd/pepsi-dispatch")
	cmd := exec.Command(filepath.Join(bin, "pepsi-dispatch"), "-version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &bytes.Buffer{}, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pepsi-dispatch -version: %v: %s", err, stderr.String())
	}
	var inits []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "init" {
			inits = append(inits, f[1])
		}
	}
	const hangup = "github.com/pepsi-pipeline/pepsi/cmd/pepsi-dispatch/internal/hangup"
	for i, p := range inits {
		if p != "os/signal" {
			continue
		}
		if i+1 < len(inits) && inits[i+1] == hangup {
			return
		}
		break
	}
	t.Errorf("%s is not initialized right after os/signal; the order:\n%s", hangup, strings.Join(inits, "\n"))
}

// Proves: after the dispatcher has stopped, while it waits for its last
// export of traces (to a collector that never answers: all 5 s), SIGHUP
// is still logged and ignored, and a second SIGTERM ends the wait at once
// with the exit status the dispatcher decided (0), where both used to kill
// it (129, 143): the signals were let go when dispatch.Run returned.
func TestSignalsDuringTheLastExportOfTracesKeepTheExitStatus(t *testing.T) {
	t.Parallel()
	bin, url, conf, dead := deadCollectorPipeline(t, 1)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + dead, "OTEL_EXPORTER_OTLP_TIMEOUT=3600000"}
	d, _ := run(t, filepath.Join(bin, "pepsi-dispatch"), otel, "exporting traces", "-c", conf)
	waitDone(t, url, 1)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitLine := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.log.String(), what); time.Sleep(10 * time.Millisecond) {
			select {
			case <-d.done:
				t.Fatalf("pepsi-dispatch exited (status %d, signal %d) before logging %q", d.cmd.ProcessState.ExitCode(), signaled(d.cmd), what)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("pepsi-dispatch did not log %q within 30 s", what)
			}
		}
	}
	awaitLine("pepsi-dispatch stopped")
	stopped := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	awaitLine("SIGHUP ignored")
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no exit within 30 s of the second SIGTERM")
	}
	if s := signaled(d.cmd); s != 0 || d.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exit %d, signal %d; want 0 and no signal", d.cmd.ProcessState.ExitCode(), s)
	}
	if !strings.Contains(d.log.String(), "signal received while exporting the last traces") {
		t.Errorf("the log does not say the second signal ended the export:\n%s", d.log)
	}
	t.Logf("exited %v after the log's \"pepsi-dispatch stopped\" (the export's own bound: 5 s)", time.Since(stopped).Round(time.Millisecond))
}
