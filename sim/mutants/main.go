// Command mutants checks that the simulator catches bugs: it plants small
// deliberate bugs in the real core (text patches of core/core.go), builds
// pepsi-sim against each mutated core with "go build -overlay" (the module is not
// copied and the core has no test-only hooks), runs a seed campaign, and reports
// which mutants the simulator kills, with the seed and how long it took. Every
// mutant must be killed; one that survives means the simulator must get stronger
// (not the mutant weaker).
//
//	go run ./sim/mutants                 every mutant
//	go run ./sim/mutants -only 'flush'   those whose name matches
//
// Run it from the module root (make mutants does). It exits 1 if a mutant
// survives, a patch no longer applies (core.go changed under it: update the
// patch), a mutant does not compile, or a regression seed kept for a bug no
// longer finds that bug when the bug is planted again.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// mutant is one planted bug: old must occur exactly once in core/core.go, and
// so must each of more's. regress lists regression seeds (testdata/sim/seeds.txt)
// that found this bug for real: each must still fail against the mutant, or the
// seed no longer reaches the situation it is kept for.
type mutant struct {
	name    string
	bug     string
	old     string
	new     string
	more    []patch
	regress []uint64
}

type patch struct{ old, new string }

func (m mutant) patches() []patch { return append([]patch{{m.old, m.new}}, m.more...) }

// mut is a mutant of one patch with no regression seed.
func mut(name, bug, old, new string) mutant { return mutant{name: name, bug: bug, old: old, new: new} }

var mutants = []mutant{
	mut("requeue-dropped-on-crash", "the messages behind a crashed worker's head are never requeued",
		"\tc.requeue(st, q[1:])\n\tc.logf(\"error\", \"stage %s worker pid %d crashed",
		"\tc.logf(\"error\", \"stage %s worker pid %d crashed"),
	mut("watchdog-timed-from-dispatch", "the next head keeps the clock of when the batch was handed over",
		"\telapsed := c.now.Sub(w.headSince).Microseconds()\n\tw.headSince = c.now\n",
		"\telapsed := c.now.Sub(w.headSince).Microseconds()\n"),
	mut("watchdog-never-fires", "a hung head is never killed",
		"if !c.dbDown && !c.now.Before(w.headSince.Add(c.cfg.MaxRuntime)) {",
		"if false {"),
	mut("capacity-off-by-one", "a stage claims one more row than it can hold",
		"return max(0, free-len(st.backlog))",
		"return max(0, free-len(st.backlog)+1)"),
	mut("parallelism-off-by-one", "a stage spawns PARALLELISM+1 workers",
		"for need > 0 && len(st.workers) < st.cfg.Parallelism && !st.coolingDown(c.now) {",
		"for need > 0 && len(st.workers) <= st.cfg.Parallelism && !st.coolingDown(c.now) {"),
	mut("queue-limit-off-by-one", "a worker is handed QUEUE_LIMIT+1 ids",
		"w.stage.cfg.QueueLimit-len(w.queue)",
		"w.stage.cfg.QueueLimit+1-len(w.queue)"),
	mut("wrong-item-stage", "requeue items name no stage, so the guard cannot tell an advance",
		"c.owe(Item{ID: m.id, Stage: st.cfg.Name, Status: \"pending\"})",
		"c.owe(Item{ID: m.id, Stage: \"\", Status: \"pending\"})"),
	mut("epoch-guard-dropped", "a 0 that left the row running is failed even if a crash lost the stage's commit",
		"Status: \"failed\", Epoch: head.epoch, Reason: st.stuckReason}",
		"Status: \"failed\", Reason: st.stuckReason}"),
	mut("timeout-head-failed", "the head the watchdog killed is failed instead of timed out",
		"c.owe(Item{ID: q[0].id, Stage: name, Status: \"timeout\",",
		"c.owe(Item{ID: q[0].id, Stage: name, Status: \"failed\","),
	mut("start-failure-is-a-crash", "a worker that dies at start fails its head instead of cooling down",
		"if w.answered == 0 && c.now.Sub(w.spawnedAt) < StartWindow {",
		"if false {"),
	mut("protocol-error-ignored", "a line that is not a status line counts as success",
		"\ts, err := ParseStatus(e.Line)\n\tif err != nil {",
		"\ts, err := ParseStatus(e.Line)\n\tif err != nil && false {"),
	mut("stats-double-counted", "flushed deltas are never cleared, so they are added again",
		"\tclear(c.stats)\n",
		""),
	mut("fused-credited-to-own-stage", "fused passes are credited to the stage that ran them",
		"d := c.stat(f.Stage)",
		"d := c.stat(st.cfg.Name)"),
	mut("left-double-counted", "a done message counts twice in messages_left",
		"\t\tcase \"done\":\n\t\t\tc.left++",
		"\t\tcase \"done\":\n\t\t\tc.left += 2"),
	mut("lost-flush-dropped", "a flush whose reply was lost is never sent again",
		"c.unflushed = &cmd",
		"_ = cmd"),
	mut("idle-flush-not-rate-limited", "going idle flushes every time, not at most once a second",
		"if idle && !c.now.Before(c.lastFlush.Add(IdleFlushMin)) {",
		"if idle {"),
	mut("claim-while-txn-outstanding", "a new transaction is issued before the last one's results are in",
		"if c.dbDown || len(c.txn) > 0 || c.shutdown == 2 {",
		"if c.dbDown || c.shutdown == 2 {"),
	mut("reset-without-keep", "the reset after a lost claim resets rows this core holds",
		"\t\tif !c.resetDone {\n\t\t\tkeep = nil\n\t\t}",
		"\t\tkeep = nil"),
	{"reset-keeps-unsure-rows", "the reset after a lost claim keeps rows whose resolve may have applied",
		"keep := slices.DeleteFunc(c.held(), func(id int64) bool { return c.unsure[id] })",
		"keep := c.held()", nil, []uint64{333, 18959}},
	mut("lost-claim-not-reset", "rows a lost claim may have taken are never reset",
		"\t\tc.needReset = true\n\t\treturn\n\t}\n\tc.epoch = e.Epoch",
		"\t\treturn\n\t}\n\tc.epoch = e.Epoch"),
	mut("exit-zero-before-reset", "a shutdown exits 0 while a lost claim's rows may be running",
		"c.unflushed != nil || c.hasDeltas() || c.needReset) {",
		"c.unflushed != nil || c.hasDeltas()) {"),
	{"exit-zero-with-orphans", "a shutdown exits 0 at once while a lost claim's rows may be running (the bug seed 4 found)",
		"c.unflushed != nil || c.hasDeltas() || c.needReset) {",
		"c.unflushed != nil || c.hasDeltas()) {",
		[]patch{{"c.unflushed != nil || c.hasDeltas() || c.needReset {\n\t\tcode = 1", "c.unflushed != nil || c.hasDeltas() {\n\t\tcode = 1"}},
		[]uint64{4}},
	mut("exit-code-ignores-reset", "a shutdown that cannot reset a lost claim's rows still exits 0",
		"c.unflushed != nil || c.hasDeltas() || c.needReset {\n\t\tcode = 1",
		"c.unflushed != nil || c.hasDeltas() {\n\t\tcode = 1"),
	mut("wake-only-on-heartbeat", "paused rows are woken at the next heartbeat, not at their timeout",
		"if c.shutdown == 0 && (c.wakeDue || (!c.nextPaused.IsZero() && !c.now.Before(c.nextPaused))) {",
		"if c.shutdown == 0 && c.wakeDue {"),
	mut("shutdown-forgets-backlog", "claimed rows not yet handed out are not reset at shutdown",
		"\t\tfor _, st := range c.stages {\n\t\t\tc.requeue(st, st.backlog)\n\t\t\tst.backlog = nil\n\t\t}\n\tcase 1:",
		"\tcase 1:"),
	mut("reap-too-early", "idle workers are stopped at once, not after WORKER_IDLE_TIMEOUT",
		"} else if len(w.stage.backlog) == 0 && !c.now.Before(w.idleSince.Add(c.cfg.IdleTimeout)) {",
		"} else if len(w.stage.backlog) == 0 {"),
	mut("never-recycled", "a worker that has handled MAX_MESSAGES is not recycled",
		"if w.handed >= w.stage.cfg.MaxMessages {",
		"if false {"),
	mut("cooldown-ignored", "a stage whose program cannot start is respawned at once",
		"for need > 0 && len(st.workers) < st.cfg.Parallelism && !st.coolingDown(c.now) {",
		"for need > 0 && len(st.workers) < st.cfg.Parallelism {"),
	{name: "wake-takes-held-rows", bug: "a row its stage paused with a due timeout is woken and claimed again before its answer is read",
		old: "Wake{Op: c.nextOpID(), Now: c.now, Keep: c.handed()}", new: "Wake{Op: c.nextOpID(), Now: c.now}", regress: []uint64{121}},
}

type options struct {
	runs    int
	maxTime time.Duration
	workers int
	only    string
}

func main() {
	var o options
	flag.IntVar(&o.runs, "runs", 20000, "seeds each mutant's campaign may run")
	flag.DurationVar(&o.maxTime, "max-time", 90*time.Second, "wall time each mutant's campaign may take")
	flag.IntVar(&o.workers, "workers", 2, "scenarios run at once")
	flag.StringVar(&o.only, "only", "", "run only mutants whose name matches this regular expression")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	root, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	corePath := filepath.Join(root, "core", "core.go")
	src, err := os.ReadFile(corePath)
	if err != nil {
		return fmt.Errorf("run from the module root: %w", err)
	}
	only, err := regexp.Compile(o.only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	tmp, err := os.MkdirTemp("", "pepsi-mutants-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	fmt.Printf("baseline: the unmutated core must pass the same campaign (%d seeds or %s)\n", o.runs, o.maxTime)
	base := filepath.Join(tmp, "pepsi-sim")
	if out, err := goBuild(root, "", base); err != nil {
		return fmt.Errorf("build pepsi-sim: %w\n%s", err, out)
	}
	r := campaign(base, o)
	if r.err != nil || r.failed {
		return fmt.Errorf("the unmutated core fails the campaign; fix that first:\n%s", r.out)
	}
	fmt.Printf("baseline passed: %s\n\n", r.summary)

	var survived, broken []string
	for i, m := range mutants {
		if !only.MatchString(m.name) {
			continue
		}
		mutatedSrc, ok := src, true
		for _, pt := range m.patches() {
			if n := bytes.Count(src, []byte(pt.old)); n != 1 {
				fmt.Printf("STALE     %-30s a patch matches %d times in core/core.go (want 1): update it\n", m.name, n)
				ok = false
				break
			}
			mutatedSrc = bytes.Replace(mutatedSrc, []byte(pt.old), []byte(pt.new), 1)
		}
		if !ok {
			broken = append(broken, m.name)
			continue
		}
		dir := filepath.Join(tmp, strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mutant dir: %w", err)
		}
		mutated := filepath.Join(dir, "core.go")
		if err := os.WriteFile(mutated, mutatedSrc, 0o644); err != nil {
			return fmt.Errorf("write mutant: %w", err)
		}
		overlay := filepath.Join(dir, "overlay.json")
		ov, err := json.Marshal(map[string]map[string]string{"Replace": {corePath: mutated}})
		if err != nil {
			return fmt.Errorf("overlay: %w", err)
		}
		if err := os.WriteFile(overlay, ov, 0o644); err != nil {
			return fmt.Errorf("write overlay: %w", err)
		}
		bin := filepath.Join(dir, "pepsi-sim")
		if out, err := goBuild(root, overlay, bin); err != nil {
			fmt.Printf("NOBUILD   %-30s %v\n%s\n", m.name, err, out)
			broken = append(broken, m.name)
			continue
		}
		r := campaign(bin, o)
		switch {
		case r.err != nil:
			fmt.Printf("ERROR     %-30s %v\n", m.name, r.err)
			broken = append(broken, m.name)
		case r.failed:
			fmt.Printf("KILLED    %-30s %s in %.1fs (%s): %s\n", m.name, r.seed, r.wall.Seconds(), r.summary, r.why)
		default:
			fmt.Printf("SURVIVED  %-30s %s — %s\n", m.name, r.summary, m.bug)
			survived = append(survived, m.name)
		}
		for _, seed := range m.regress {
			if err := exec.Command(bin, "-seed", strconv.FormatUint(seed, 10)).Run(); err == nil {
				fmt.Printf("STALESEED %-30s regression seed %d no longer finds this bug: pick a new one\n", m.name, seed)
				broken = append(broken, m.name)
			}
		}
	}
	fmt.Println()
	if len(survived) > 0 || len(broken) > 0 {
		return fmt.Errorf("survived: %v; stale or broken: %v", survived, broken)
	}
	fmt.Println("every mutant was killed")
	return nil
}

func goBuild(root, overlay, out string) ([]byte, error) {
	args := []string{"build", "-o", out}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, "./cmd/pepsi-sim")...)
	cmd.Dir = root
	return cmd.CombinedOutput()
}

type outcome struct {
	failed  bool
	seed    string
	why     string
	summary string
	wall    time.Duration
	out     string
	err     error
}

var (
	seedRe    = regexp.MustCompile(`(?m)^seed (\d+); replay`)
	whyRe     = regexp.MustCompile(`(?m)^simulation failed at step \d+, [^:]+: (.*)$`)
	summaryRe = regexp.MustCompile(`(?m)^(\d+) scenarios in [^:]*`)
)

// campaign runs pepsi-sim over seeds 1.. and reads what it found.
func campaign(bin string, o options) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), o.maxTime+time.Minute)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, bin, "-runs", strconv.Itoa(o.runs), "-start", "1",
		"-workers", strconv.Itoa(o.workers), "-max-time", o.maxTime.String(), "-q")
	out, err := cmd.CombinedOutput()
	r := outcome{wall: time.Since(began), out: string(out)}
	if m := summaryRe.FindStringSubmatch(r.out); m != nil {
		r.summary = m[0]
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		r.failed = true
		if m := seedRe.FindStringSubmatch(r.out); m != nil {
			r.seed = "seed " + m[1]
		}
		if m := whyRe.FindStringSubmatch(r.out); m != nil {
			r.why = clip(m[1], 160)
		}
	default:
		r.err = fmt.Errorf("%w: %s", err, clip(strings.TrimSpace(r.out), 500))
	}
	return r
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
