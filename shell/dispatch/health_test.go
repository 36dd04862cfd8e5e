package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
	"golang.org/x/sys/unix"
)

// health reads pepsi.stage_health by stage.
func (e *env) health() map[string]store.StageHealth {
	e.t.Helper()
	h, err := store.On(e.db).ReadHealth(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[string]store.StageHealth{}
	for _, st := range h.Stages {
		m[st.Stage] = st
	}
	return m
}

// oldestPending is the oldest pending wait at stage (store.CountRows).
func (e *env) oldestPending(stage string) time.Duration {
	e.t.Helper()
	depth, err := store.On(e.db).CountRows(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range depth {
		if d.Stage == stage && d.Status == core.StatusPending {
			return d.OldestWait
		}
	}
	return 0
}

// A stage whose program is missing is recorded cannot_start at once, before
// any message needs a worker, with one log line that says why, while the
// other stage is recorded ok: an operator does not see a broken deployment
// as green until the first message comes.
func TestAStageWhoseProgramIsMissingIsCannotStartBeforeAnyMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @DIR@/missing\n[stage-b]\nPROGRAM = @BIN@/teststage\n")
	d := e.start()
	defer d.stopClean()
	waitFor(t, 5*time.Second, "stage a recorded cannot_start", func() (bool, string) {
		h := e.health()
		return h["a"].State == core.HealthCannotStart && h["b"].State == core.HealthOK, fmt.Sprint(h)
	})
	if a := e.health()["a"]; !strings.Contains(a.Reason, filepath.Join(e.dir, "missing")) || !strings.Contains(a.Reason, "no message has needed a worker yet") {
		t.Errorf("stage a recorded %+v, want its program and that no message needed it yet", a)
	}
	if n := len(d.logs.lines("stage a: cannot start")); n != 1 {
		t.Errorf("%d log lines say stage a cannot start, want 1", n)
	}
}

// A stage whose program is missing is recorded cannot_start, with the
// error and the cooldown, within a cooldown of the first claim, while the
// other stage is recorded ok; its messages' oldest pending wait grows with
// the clock through the failed starts (each gives the claimed rows back);
// once the program is there and answers, the stage is recorded ok again.
func TestAStageWhoseProgramIsMissingIsRecordedCannotStartAndItsWaitGrows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n[stage-a]\nPROGRAM = @DIR@/later\n[stage-b]\nPROGRAM = @BIN@/teststage\n")
	e.insert("a", repeat("a=done", 3)...)
	inserted := time.Now()
	d := e.start()
	defer d.stopClean()
	waitFor(t, 2*core.CooldownMin, "stage a recorded cannot_start", func() (bool, string) {
		h := e.health()
		// (Its spawns' failure, not the start-up check of its program.)
		return h["a"].State == core.HealthCannotStart && strings.Contains(h["a"].Reason, "held back") && h["b"].State == core.HealthOK, fmt.Sprint(h)
	})
	a := e.health()["a"]
	if !strings.Contains(a.Reason, filepath.Join(e.dir, "later")) || !strings.Contains(a.Reason, "held back") || a.Until.IsZero() {
		t.Errorf("stage a recorded %+v, want its program, its error, the cooldown and its end", a)
	}
	waitFor(t, 15*time.Second, "three attempts to start the program", func() (bool, string) {
		n := len(d.logs.lines("next try in"))
		return n >= 3, fmt.Sprintf("%d attempts", n)
	})
	// Failed starts have claimed the messages and given them back (each
	// makes them running for a moment, until the requeue commits).
	waitFor(t, 5*time.Second, "the oldest pending wait at a to count from the insert", func() (bool, string) {
		wait, since := e.oldestPending("a"), time.Since(inserted)
		return since > 3*time.Second && wait > since-time.Second, fmt.Sprintf("%v after %v of failed starts", wait, since)
	})
	if s := e.health()["a"]; !s.Since.Equal(a.Since) {
		t.Errorf("since moved from %v to %v while the stage stayed cannot_start", a.Since, s.Since)
	}
	if err := os.Symlink(filepath.Join(binDir, "teststage"), filepath.Join(e.dir, "later")); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(20*time.Second, map[string]int{"done": 3})
	waitFor(t, 5*time.Second, "stage a recorded ok", func() (bool, string) {
		h := e.health()
		return h["a"].State == core.HealthOK && h["a"].Reason == "", fmt.Sprint(h)
	})
}

// A dispatcher run by a service user, whose stage's program only root may
// run (installed by root with mode 0700), records that stage cannot_start
// at once, before any message needs a worker, naming why: the program's mode
// bits say "executable", the kernel's check for this user says no. Given
// CAP_DAC_OVERRIDE (systemd's AmbientCapabilities), the same user may run
// it, and the stage is ok: the check is the kernel's, as exec's is. (The
// test runs pepsi-dispatch as user nobody, which needs root.)
func TestAProgramTheDispatchersUserMayNotRunIsCannotStartBeforeAnyMessage(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test starts pepsi-dispatch as user nobody, which needs root (CI runs as root)")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	// A directory nobody may read, for the configuration; the program in it
	// is root's alone.
	dir, err := os.MkdirTemp("", "pepsi-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(binDir, 0o755); err != nil { // pepsi-dispatch and teststage
		t.Fatal(err)
	}
	program := filepath.Join(dir, "rootonly")
	if err := os.WriteFile(program, []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "[stage-a]\nPROGRAM = "+program+"\n[stage-b]\nPROGRAM = @BIN@/teststage\n")
	conf := filepath.Join(dir, "pepsi.conf")
	text, err := os.ReadFile(e.conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		caps []uintptr
		want core.HealthState
	}{{nil, core.HealthCannotStart}, {[]uintptr{unix.CAP_DAC_OVERRIDE}, core.HealthOK}} {
		started := time.Now()
		cmd, out := command(context.Background(), "-c", conf, "-log-format", "json")
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, AmbientCaps: c.caps}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("stage a recorded %s (capabilities %v)", c.want, c.caps), func() (bool, string) {
			h := e.health()
			// (Recorded by this dispatcher: the server's clock is this host's.)
			return h["a"].State == c.want && h["b"].State == core.HealthOK && h["a"].UpdatedAt.After(started), fmt.Sprint(h)
		})
		if a := e.health()["a"]; c.want == core.HealthCannotStart && !strings.Contains(a.Reason, "may not be executed by this user") {
			t.Errorf("stage a recorded %+v, want why its program cannot run", a)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("pepsi-dispatch as nobody (capabilities %v): %v\n%s", c.caps, err, out)
		}
	}
}
