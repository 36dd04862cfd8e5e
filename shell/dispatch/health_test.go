package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
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
