// Command mutants checks that the simulator catches bugs: it plants small
// deliberate bugs in the real core (patches of package core's files, each found
// by its Go tokens wherever in the package it stands, see match.go), builds
// pepsi-sim against each mutated core with "go build -overlay" (the module is
// not copied and the core has no test-only hooks), runs a seed campaign, and
// reports which mutants the simulator kills, with the seed, the rule that
// killed it and how long it took. Every mutant must be killed, and by the rule
// it names (a rule of the checker: pepsi-sim -rules lists them). One that
// survives means the simulator must get stronger (not the mutant weaker); one
// killed by another rule means the rule meant to catch it does not, or the
// mutant names the wrong one.
//
//	go run ./sim/mutants                 every mutant
//	go run ./sim/mutants -only 'flush'   those whose name matches
//
// Run it from the module root (make mutants does). It exits 1 if a mutant
// survives, a patch no longer applies (the core changed under it: update the
// patch; checked for every mutant before any campaign runs), a mutant names no
// rule of the checker, a mutant does not compile, a mutant dies by another rule
// than its own, or a regression seed kept for a bug no longer finds that bug
// when the bug is planted again.
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
	tmp, err := os.MkdirTemp("", "pepsi-mutants-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	if err := baseline(root, tmp, src, order, o); err != nil {
		return err
	}
	var survived, broken []string
	for i, m := range mutants {
		if !only.MatchString(m.name) {
			continue
		}
		changed, err := mutate(m, src, order)
		if err != nil {
			return err
		}
		bin, out, err := buildMutant(root, filepath.Join(tmp, strconv.Itoa(i)), changed)
		if err != nil {
			fmt.Printf("NOBUILD   %-30s %v\n%s\n", m.name, err, out)
			broken = append(broken, m.name)
			continue
		}
		killed, ok := judge(m, bin, o)
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
	r := campaign(base, o)
	if r.err != nil || r.failed {
		return fmt.Errorf("the unmutated core fails the campaign; fix that first:\n%s", r.out)
	}
	fmt.Printf("baseline passed: %s\n\n", r.summary)
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

// judge runs m's campaign against its binary and prints the verdict: killed
// reports whether the simulator caught it, ok whether it was caught as it
// must be (by its own rule, without error) and its regression seeds still
// find it.
func judge(m mutant, bin string, o options) (killed, ok bool) {
	r := campaign(bin, o)
	killed, ok = true, true
	switch {
	case r.err != nil:
		fmt.Printf("ERROR     %-30s %v\n", m.name, r.err)
		ok = false
	case r.failed && r.rule != m.rule:
		fmt.Printf("WRONGRULE %-30s %s in %.1fs by rule %s, not %s: %s\n", m.name, r.seed, r.wall.Seconds(), r.rule, m.rule, r.why)
		ok = false
	case r.failed:
		fmt.Printf("KILLED    %-30s %s in %.1fs (%s): %s\n", m.name, r.seed, r.wall.Seconds(), r.summary, r.why)
	default:
		fmt.Printf("SURVIVED  %-30s %s — %s\n", m.name, r.summary, m.bug)
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
	failed  bool
	seed    string
	rule    string
	why     string
	summary string
	wall    time.Duration
	out     string
	err     error
}

var (
	seedRe    = regexp.MustCompile(`(?m)^seed (\d+); replay`)
	whyRe     = regexp.MustCompile(`(?m)^simulation failed at step \d+, [^:]+: (.*)$`)
	ruleRe    = regexp.MustCompile(`(?m)^simulation failed at step \d+, [^:]+: rule ([a-z0-9-]+):`)
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
