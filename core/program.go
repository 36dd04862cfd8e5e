// A stage whose program cannot be run, found before any message needs a
// worker: the shell checks every stage's PROGRAM at start-up (found,
// executable) without running it, and again every ProgramCheckEvery for a
// stage whose check failed, until one passes or a worker of the stage
// starts. Without it a stage with no pending messages, whose program is
// missing, would show ok until the first message came, and an operator would
// see a broken deployment as green (health.go).

package core

import (
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// ProgramCheckEvery is how often the program of a stage whose check failed is
// checked again while no worker of the stage runs: as often as the longest
// spawn cooldown lets a stage with messages try a start.
const ProgramCheckEvery = CooldownMax

// programChecked takes the result of a check of st's program: a failure is
// the stage's health until a check passes or one of its workers starts.
func (c *Core) programChecked(st *stage, err string) {
	if st == nil {
		return
	}
	switch {
	case err == "" && st.programErr != "":
		st.programErr = ""
		c.logf(LevelInfo, "stage %s: its program %s can be run now", st.cfg.Name, conf.Quote(st.cfg.Program))
	case err != "" && st.programErr == "":
		st.programErr = err
		c.logf(LevelError, "stage %s: cannot start %s: %s (no message has needed a worker yet; checked again every %s)",
			st.cfg.Name, st.cfg.Program, err, ProgramCheckEvery)
	case err != "":
		st.programErr = err
	}
	st.programCheckAt = time.Time{}
	if st.programErr != "" {
		st.programCheckAt = c.now.Add(ProgramCheckEvery)
	}
}

// programChecks asks for the checks that are due: of each stage whose
// program could not be run at its last check and of which no worker runs.
func (c *Core) programChecks() {
	if c.shutdown > 0 {
		return
	}
	for _, st := range c.stages {
		if st.programErr == "" || st.programCheckAt.IsZero() || c.now.Before(st.programCheckAt) {
			continue
		}
		st.programCheckAt = c.now.Add(ProgramCheckEvery)
		c.emit(CheckProgram{Stage: st.cfg.Name})
	}
}
