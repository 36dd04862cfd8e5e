// Command mutants checks that the simulator catches bugs: it plants small
// deliberate bugs in the real core (patches of package core's files, each found
// by its Go tokens wherever in the package it stands, see match.go), builds
// pepsi-sim against each mutated core with "go build -overlay" (the module is
// not copied and the core has no test-only hooks), runs a seed campaign, and
// reports which mutants the simulator kills, with the seed, the rule that
// killed it and how long it took. Every mutant must be killed, and by the rule
// it names (a rule of the checker: pepsi-sim -rules lists them). One that
// survives means the simulator must get stronger (not the mutant weaker); one
// killed only by other rules means the rule meant to catch it does not, or the
// mutant names the wrong one.
//
// A mutated core may break more than one rule, and which fires first depends
// on the seeds' draws, which change whenever the fake world grows. So a
// campaign that stops on a seed that broke another rule does not decide the
// verdict: it goes on from the next seed (pepsi-sim -start), within the same
// budget (seeds 1..-runs, -max-time of wall time in all), until the mutant's
// own rule fires (KILLED, naming the other rules that fired first and their
// seeds) or the budget is spent (WRONGRULE, naming the rules that did fire).
// A mutant the campaign does not reach is KILLED all the same when one of its
// regression seeds (testdata/sim/seeds.txt, which go test ./sim runs on every
// change) breaks its own rule: the simulator catches the bug, and the line
// says the campaign did not; the seeds' draws decide how far a campaign
// reaches.
//
//	go run ./sim/mutants                 every mutant
//	go run ./sim/mutants -only 'flush'   those whose name matches
//	go run ./sim/mutants -only 'flush' -runs 1 -keep /tmp/m
//
// The last keeps what it builds: each chosen mutant's pepsi-sim in
// /tmp/m/NAME/, the real core's in /tmp/m/, to replay a seed or run a
// campaign against a mutant by hand (a stale regression seed needs a new one).
//
// Run it from the module root (make mutants does). It exits 1 if a mutant
// survives, a patch no longer applies (the core changed under it: update the
// patch; checked for every mutant before any campaign runs), a mutant names no
// rule of the checker, a mutant does not compile, a mutant's own rule never
// fires within the budget though other rules do, or a regression seed kept
// for a bug no longer finds that bug when the bug is planted again.
package main

import (
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

// mutant is one planted bug: old must occur exactly once in package core (all
// its non-test files together), and so must each of more's. regress lists regression seeds (testdata/sim/seeds.txt)
// that found this bug for real: each must still fail against the mutant, or the
// seed no longer reaches the situation it is kept for.
type mutant struct {
	name    string
	rule    string // the checker's rule that must kill it
	bug     string
	old     string
	new     string
	more    []patch
	regress []uint64
	// test names a test of ./core that fails with the mutant: a
	// deterministic proof of the bug for when no campaign seed reaches it
	// any more (the simulator's choices moved on), run like regress.
	test string
}

type patch struct{ old, new string }

func (m mutant) patches() []patch { return append([]patch{{m.old, m.new}}, m.more...) }

// mut is a mutant of one patch with no regression seed, killed by rule.
func mut(name, rule, bug, old, new string) mutant {
	return mutant{name: name, rule: rule, bug: bug, old: old, new: new}
}

type options struct {
	runs    int
	maxTime time.Duration
	workers int
	only    string
	keep    string
}

func main() {
	var o options
	flag.IntVar(&o.runs, "runs", 20000, "seeds each mutant's campaign may run")
	flag.DurationVar(&o.maxTime, "max-time", 90*time.Second, "wall time each mutant's campaign may take")
	flag.IntVar(&o.workers, "workers", 2, "scenarios run at once")
	flag.StringVar(&o.only, "only", "", "run only mutants whose name matches this regular expression")
	flag.StringVar(&o.keep, "keep", "", "build into this directory, each mutant's pepsi-sim in NAME/, and keep it")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

// coreSources reads every non-test Go file of package core, by path. A patch is
// looked for in all of them, so a function that moves to another file of the
// package takes its mutants along.
func coreSources(root string) (map[string][]byte, []string, error) {
	paths, err := filepath.Glob(filepath.Join(root, "core", "*.go"))
	if err != nil {
		return nil, nil, fmt.Errorf("list core: %w", err)
	}
	src := map[string][]byte{}
	var order []string
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, fmt.Errorf("run from the module root: %w", err)
		}
		src[p] = b
		order = append(order, p)
	}
	if len(order) == 0 {
		return nil, nil, errors.New("no Go files in core/: run from the module root")
	}
	return src, order, nil
}

// mutate applies m's patches to the core's sources. Each patch's old text must
// match exactly once in the whole package, by its tokens (see match.go); the
// result maps each changed file to its mutated text.
func mutate(m mutant, src map[string][]byte, order []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, pt := range m.patches() {
		pattern, err := scan(pt.old)
		if err != nil || len(pattern) == 0 {
			return nil, fmt.Errorf("a patch's old text %q: %v", clip(pt.old, 80), err)
		}
		var file string
		var at []match
		for _, p := range order {
			cur := src[p]
			if b, ok := out[p]; ok {
				cur = b
			}
			toks, err := scan(string(cur))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if found := find(pattern, toks); len(found) > 0 {
				file, at = p, append(at, found...)
			}
		}
		if len(at) != 1 {
			return nil, fmt.Errorf("a patch matches %d times in package core (want 1): update it: %q", len(at), clip(pt.old, 80))
		}
		repl, err := rename(strings.TrimSpace(pt.new), at[0].names)
		if err != nil {
			return nil, fmt.Errorf("a patch's new text %q: %w", clip(pt.new, 80), err)
		}
		cur := src[file]
		if b, ok := out[file]; ok {
			cur = b
		}
		out[file] = []byte(string(cur[:at[0].from]) + repl + string(cur[at[0].to:]))
	}
	return out, nil
}

func run(o options) error {
	root, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	src, order, err := coreSources(root)
	if err != nil {
		return err
	}
	only, err := regexp.Compile(o.only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	tmp := o.keep
	if tmp == "" {
		if tmp, err = os.MkdirTemp("", "pepsi-mutants-"); err != nil {
			return fmt.Errorf("temp dir: %w", err)
		}
		defer os.RemoveAll(tmp)
	}

	if err := baseline(root, tmp, src, order, o); err != nil {
		return err
	}
	var survived, broken []string
	for _, m := range mutants {
		if !only.MatchString(m.name) {
			continue
		}
		changed, err := mutate(m, src, order)
		if err != nil {
			return err
		}
		bin, out, err := buildMutant(root, filepath.Join(tmp, m.name), changed)
		if err != nil {
			fmt.Printf("NOBUILD   %-30s %v\n%s\n", m.name, err, out)
			broken = append(broken, m.name)
			continue
		}
		killed, ok := judge(m, root, bin, o)
		if !killed {
			survived = append(survived, m.name)
		}
		if !ok {
			broken = append(broken, m.name)
		}
	}
	fmt.Println()
	if len(survived) > 0 || len(broken) > 0 {
		return fmt.Errorf("survived: %v; stale or broken: %v", survived, broken)
	}
	fmt.Println("every mutant was killed")
	return nil
}

// checkRules fails unless every mutant names a rule the checker of bin has
// (pepsi-sim -rules), so a renamed rule is caught before any campaign runs.
func checkRules(bin string) error {
	out, err := exec.Command(bin, "-rules").Output()
	if err != nil {
		return fmt.Errorf("pepsi-sim -rules: %w", err)
	}
	known := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if name, _, ok := strings.Cut(l, " ("); ok && !strings.HasPrefix(l, "\t") {
			known[name] = true
		}
	}
	var bad []string
	for _, m := range mutants {
		if !known[m.rule] {
			bad = append(bad, fmt.Sprintf("%s (rule %q)", m.name, m.rule))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("mutants naming no rule of the checker (pepsi-sim -rules lists them): %v", bad)
	}
	return nil
}

// baseline checks what must hold before any mutant's campaign runs: every
// mutant applies (a patch that no longer matches is a failure, never a skip),
// names a rule of the checker, and the unmutated core passes the campaign.
func baseline(root, tmp string, src map[string][]byte, order []string, o options) error {
	var stale []string
	for _, m := range mutants {
		if _, err := mutate(m, src, order); err != nil {
			fmt.Printf("STALE     %-30s %v\n", m.name, err)
			stale = append(stale, m.name)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("stale mutants: %v", stale)
	}
	base := filepath.Join(tmp, "pepsi-sim")
	if out, err := goBuild(root, "", base); err != nil {
		return fmt.Errorf("build pepsi-sim: %w\n%s", err, out)
	}
	if err := checkRules(base); err != nil {
		return err
	}
	fmt.Printf("baseline: the unmutated core must pass the same campaign (%d seeds or %s)\n", o.runs, o.maxTime)
	r := campaign(base, o.workers, 1, o.runs, o.maxTime)
	if r.err != nil || r.failed {
		return fmt.Errorf("the unmutated core fails the campaign; fix that first:\n%s", r.out)
	}
	fmt.Printf("baseline passed: %d scenarios in %.1fs\n\n", r.scenarios, r.wall.Seconds())
	return nil
}

// buildMutant writes a mutant's changed files into dir and builds pepsi-sim
// against them with an overlay, returning the binary, or the build's output
// and error.
func buildMutant(root, dir string, changed map[string][]byte) (string, []byte, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("mutant dir: %w", err)
	}
	replace := map[string]string{}
	for p, b := range changed {
		mutated := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(mutated, b, 0o644); err != nil {
			return "", nil, fmt.Errorf("write mutant: %w", err)
		}
		replace[p] = mutated
	}
	overlay := filepath.Join(dir, "overlay.json")
	ov, err := json.Marshal(map[string]map[string]string{"Replace": replace})
	if err != nil {
		return "", nil, fmt.Errorf("overlay: %w", err)
	}
	if err := os.WriteFile(overlay, ov, 0o644); err != nil {
		return "", nil, fmt.Errorf("write overlay: %w", err)
	}
	bin := filepath.Join(dir, "pepsi-sim")
	out, err := goBuild(root, overlay, bin)
	return bin, out, err
}

// judge hunts m's own rule with its binary and prints the verdict: killed
// reports whether the simulator caught it, ok whether it was caught as it
// must be (by its own rule, without error) and its regression seeds still
// find it.
func judge(m mutant, root, bin string, o options) (killed, ok bool) {
	h := hunt(m.rule, bin, o)
	r := h.last
	killed, ok = true, true
	var byRegress *outcome
	byTest := false
	if r.err == nil && !(r.failed && r.rule == m.rule) {
		byRegress = regressKill(m, bin)
		byTest = byRegress == nil && m.test != "" && coreTestFails(root, bin, m.test)
	}
	switch {
	case r.err != nil:
		fmt.Printf("ERROR     %-30s %v\n", m.name, r.err)
		ok = false
	case r.failed && r.rule == m.rule:
		fmt.Printf("KILLED    %-30s seed %d in %.1fs (%d scenarios)%s: %s\n", m.name, r.seed, h.wall.Seconds(), h.scenarios, h.first(), r.why)
	case byRegress != nil:
		// The seeds go test ./sim runs on every change kill it by its own
		// rule: the simulator catches the bug, though a campaign of the
		// budget, from seed 1, no longer reaches its situation.
		fmt.Printf("KILLED    %-30s by regression seed %d (go test ./sim runs it; the campaign's %d scenarios in %.1fs did not reach it)%s: %s\n",
			m.name, byRegress.seed, h.scenarios, h.wall.Seconds(), h.first(), byRegress.why)
	case byTest:
		fmt.Printf("KILLED    %-30s by core test %s (go test ./core runs it; the campaign's %d scenarios in %.1fs did not reach it)%s\n",
			m.name, m.test, h.scenarios, h.wall.Seconds(), h.first())
	case len(h.others) > 0:
		fmt.Printf("WRONGRULE %-30s never by rule %s in %d scenarios, %.1fs; fired: %s\n", m.name, m.rule, h.scenarios, h.wall.Seconds(), h.fired())
		ok = false
	default:
		fmt.Printf("SURVIVED  %-30s %d scenarios in %.1fs — %s\n", m.name, h.scenarios, h.wall.Seconds(), m.bug)
		killed = false
	}
	for _, seed := range m.regress {
		if err := exec.Command(bin, "-seed", strconv.FormatUint(seed, 10)).Run(); err == nil {
			fmt.Printf("STALESEED %-30s regression seed %d no longer finds this bug: pick a new one\n", m.name, seed)
			ok = false
		}
	}
	return killed, ok
}

// coreTestFails runs test of ./core with the mutated files of bin's build
// (its overlay, beside it) and reports whether it fails, as it must.
func coreTestFails(root, bin, test string) bool {
	overlay := filepath.Join(filepath.Dir(bin), "overlay.json")
	cmd := exec.Command("go", "test", "-count=1", "-overlay", overlay, "-run", "^"+test+"$", "./core")
	cmd.Dir = root
	return cmd.Run() != nil
}

// regressKill is the first of m's regression seeds that breaks m's own rule
// with the mutated core bin, or nil.
func regressKill(m mutant, bin string) *outcome {
	for _, seed := range m.regress {
		if r := campaign(bin, 1, int(seed), 1, time.Minute); r.err == nil && r.failed && r.rule == m.rule {
			return &r
		}
	}
	return nil
}

// hunted is what a hunt for one rule found: its last campaign's outcome (a
// failure by the rule, when it fired), the failures by other rules before
// it, and the scenarios and wall time of all its campaigns together.
type hunted struct {
	last      outcome
	others    []outcome
	scenarios int
	wall      time.Duration
}

// hunt runs the campaign over seeds 1.. and, each time it stops on a seed
// that broke another rule than rule, runs it again from the next seed, until
// rule fires, the campaign passes or fails otherwise, or the budget is spent:
// seeds 1..o.runs and o.maxTime of wall time for all the campaigns together.
// pepsi-sim's workers take seeds in order and it reports the lowest failing
// one, every seed below it having passed, so going on after it skips none.
func hunt(rule, bin string, o options) hunted {
	var h hunted
	began := time.Now()
	for start := 1; ; {
		left := o.maxTime - time.Since(began)
		if start > o.runs || left <= 0 {
			break
		}
		h.last = campaign(bin, o.workers, start, o.runs-start+1, left)
		h.scenarios += h.last.scenarios
		if h.last.err != nil || !h.last.failed || h.last.rule == rule {
			break
		}
		h.others = append(h.others, h.last)
		start = int(h.last.seed) + 1
	}
	h.wall = time.Since(began)
	return h
}

// first names the other rules that fired before the hunted one, if any.
func (h hunted) first() string {
	if len(h.others) == 0 {
		return ""
	}
	return "; first " + h.fired()
}

// fired names the other rules that fired, each with its first seeds and how
// many seeds in all broke it, in the order they first fired.
func (h hunted) fired() string {
	var order []string
	seeds := map[string][]string{}
	for _, r := range h.others {
		if seeds[r.rule] == nil {
			order = append(order, r.rule)
		}
		seeds[r.rule] = append(seeds[r.rule], strconv.FormatUint(r.seed, 10))
	}
	var parts []string
	for _, rule := range order {
		s := seeds[rule]
		list := strings.Join(s[:min(3, len(s))], ", ")
		if len(s) > 3 {
			list += fmt.Sprintf(" and %d more", len(s)-3)
		}
		word := "seed"
		if len(s) > 1 {
			word = "seeds"
		}
		parts = append(parts, fmt.Sprintf("%s at %s %s", rule, word, list))
	}
	return strings.Join(parts, "; ")
}

func goBuild(root, overlay, out string) ([]byte, error) {
	args := []string{"build", "-o", out}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, "./tools/pepsi-sim")...)
	cmd.Dir = root
	return cmd.CombinedOutput()
}

type outcome struct {
	failed    bool
	seed      uint64
	rule      string
	why       string
	scenarios int
	wall      time.Duration
	out       string
	err       error
}

var (
	seedRe      = regexp.MustCompile(`(?m)^seed (\d+); replay`)
	whyRe       = regexp.MustCompile(`(?m)^simulation failed at step \d+, [^:]+: (.*)$`)
	ruleRe      = regexp.MustCompile(`(?m)^simulation failed at step \d+, [^:]+: rule ([a-z0-9-]+):`)
	scenariosRe = regexp.MustCompile(`(?m)^(\d+) scenarios in `)
)

// campaign runs pepsi-sim over runs seeds from start, for at most maxTime,
// and reads what it found.
func campaign(bin string, workers, start, runs int, maxTime time.Duration) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), maxTime+time.Minute)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(ctx, bin, "-runs", strconv.Itoa(runs), "-start", strconv.Itoa(start),
		"-workers", strconv.Itoa(workers), "-max-time", maxTime.String(), "-q")
	out, err := cmd.CombinedOutput()
	r := outcome{wall: time.Since(began), out: string(out)}
	if m := scenariosRe.FindStringSubmatch(r.out); m != nil {
		r.scenarios, _ = strconv.Atoi(m[1])
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		r.failed = true
		m := seedRe.FindStringSubmatch(r.out)
		if m == nil {
			r.err = fmt.Errorf("a failure without its seed: %s", clip(strings.TrimSpace(r.out), 500))
			break
		}
		r.seed, _ = strconv.ParseUint(m[1], 10, 64)
		if m := whyRe.FindStringSubmatch(r.out); m != nil {
			r.why = clip(m[1], 160)
		}
		if m := ruleRe.FindStringSubmatch(r.out); m != nil {
			r.rule = m[1]
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
