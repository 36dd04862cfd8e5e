package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// table is the run's summary, one Markdown table: pgbench, each pipeline
// variant, River; each figure the median of the rounds, each ratio the median of
// the rounds' ratios (both sides of a ratio measured in the same round, a few minutes
// apart at most) with its minimum and maximum. Then how answer mode compares with
// write mode at each configuration, when both ran.
func (b *bench) table(rounds []round) string {
	var s strings.Builder
	fmt.Fprintf(&s, "medians of %d rounds (ratios: median of the rounds' ratios, min–max):\n\n", len(rounds))
	s.WriteString("| row | rate | × pgbench | × River | CPU per hop (job, commit) | row versions per hop |\n")
	s.WriteString("|---|---:|---:|---:|---:|---:|\n")
	tps := collect(rounds, func(r round) (float64, bool) { return r.tps, r.tps > 0 })
	river := collect(rounds, func(r round) (float64, bool) { return r.river.jobsPerS, r.river.jobsPerS > 0 })
	if len(tps) > 0 {
		commit := collect(rounds, func(r round) (float64, bool) { return float64(r.commit) / float64(time.Microsecond), r.commit > 0 })
		fmt.Fprintf(&s, "| pgbench, %d clients, single-row INSERT | %.0f tps | 1 | %s | %s | |\n",
			b.clients, median(tps), ratioCell(rounds, func(r round) (float64, float64) { return r.tps, r.river.jobsPerS }), microsCell(commit))
	}
	for _, v := range b.variants {
		if why, ok := b.refused[v.mode]; ok && !ranIn(rounds, v) {
			fmt.Fprintf(&s, "| %s | not measured: %s | | | | |\n", v, why)
			continue
		}
		hops := collect(rounds, func(r round) (float64, bool) { p, ok := r.pipes[v]; return p.hops, ok })
		if len(hops) == 0 {
			continue
		}
		cpu := collect(rounds, func(r round) (float64, bool) { return r.pipes[v].cpuPerHop() })
		versions := collect(rounds, func(r round) (float64, bool) {
			return r.pipes[v].versionsPerHop, r.pipes[v].versionsPerHop > 0
		})
		versionsCell := ""
		if len(versions) > 0 {
			versionsCell = fmt.Sprintf("%.2f", median(versions))
		}
		fmt.Fprintf(&s, "| %s | %.0f hops/s | %s | %s | %s | %s |\n", v, median(hops),
			ratioCell(rounds, func(r round) (float64, float64) { return r.pipes[v].hops, r.tps }),
			ratioCell(rounds, func(r round) (float64, float64) { return r.pipes[v].hops, r.river.jobsPerS }),
			microsCell(cpu), versionsCell)
	}
	if len(river) > 0 {
		cpu := collect(rounds, func(r round) (float64, bool) { return r.river.cpuPerJob, r.river.cpuPerJob > 0 })
		fmt.Fprintf(&s, "| River %s, its benchmark's settings, no-op jobs | %.0f jobs/s | %s | 1 | %s | |\n", rounds[0].river.version, median(river),
			ratioCell(rounds, func(r round) (float64, float64) { return r.river.jobsPerS, r.tps }), microsCell(cpu))
	}
	sep := "\n"
	for _, c := range b.configs {
		w := variant{modeWrite, c}
		for _, m := range []mode{modeLibrary, modeAnswer} {
			a := variant{m, c}
			cell := ratioCell(rounds, func(r round) (float64, float64) { return r.pipes[a].hops, r.pipes[w].hops })
			if cell != "" {
				fmt.Fprintf(&s, "%s%s ÷ write mode at %s: %s\n", sep, m, c, cell)
				sep = ""
			}
		}
	}
	s.WriteString(b.besideBench(rounds))
	return s.String()
}

// besideBench is how each mode at each other configuration compares with the
// same mode at the bench configuration, round by round (the keyed, keys and
// backlogged configurations' figures: docs/performance.md, "Ordering per
// key"), and backlogged-keyed with keyed as well (messages with keys of
// their own beside one key's backlog, against the same without it); "" without
// the bench configuration.
func (b *bench) besideBench(rounds []round) string {
	i := slices.IndexFunc(b.configs, func(c stageConfig) bool { return c.name == "bench" })
	if i < 0 {
		return ""
	}
	keyed := slices.IndexFunc(b.configs, func(c stageConfig) bool { return c.name == "keyed" })
	var s strings.Builder
	sep := "\n"
	beside := func(m mode, c stageConfig, base int) {
		plain, other := variant{m, b.configs[base]}, variant{m, c}
		cell := ratioCell(rounds, func(r round) (float64, float64) { return r.pipes[other].hops, r.pipes[plain].hops })
		if cell != "" {
			fmt.Fprintf(&s, "%s%s mode at %s ÷ at %s: %s\n", sep, m, c.name, b.configs[base].name, cell)
			sep = ""
		}
	}
	for _, c := range b.configs {
		if c.name == "bench" {
			continue
		}
		for _, m := range b.modes {
			beside(m, c, i)
			if c.keyed && c.keyBacklog > 0 && keyed >= 0 {
				beside(m, c, keyed)
			}
		}
	}
	return s.String()
}

// collect gathers one figure from the rounds that have it.
func collect(rounds []round, f func(round) (float64, bool)) []float64 {
	var xs []float64
	for _, r := range rounds {
		if x, ok := f(r); ok {
			xs = append(xs, x)
		}
	}
	return xs
}

// ratioCell is the median of num/den over the rounds where both were measured,
// with the minimum and maximum; empty if none was.
func ratioCell(rounds []round, f func(round) (num, den float64)) string {
	var xs []float64
	for _, r := range rounds {
		if num, den := f(r); num > 0 && den > 0 {
			xs = append(xs, num/den)
		}
	}
	return ratioText(xs)
}

// ratioText formats ratios as "**1.23×** (1.10–1.30)": the median, then the
// range when there is more than one.
func ratioText(xs []float64) string { return spreadText(xs, "%.2f", "**%s×**") }

// microsCell formats CPU times in microseconds: the median and the range.
func microsCell(xs []float64) string { return spreadText(xs, "%.0f", "%s µs") }

// spreadText is xs's median, each number in format num and the median set in
// text, then the range of xs when there is more than one; "" for none.
func spreadText(xs []float64, num, text string) string {
	if len(xs) == 0 {
		return ""
	}
	out := fmt.Sprintf(text, fmt.Sprintf(num, median(xs)))
	if len(xs) > 1 {
		out += fmt.Sprintf(" (%s–%s)", fmt.Sprintf(num, slices.Min(xs)), fmt.Sprintf(num, slices.Max(xs)))
	}
	return out
}

func ranIn(rounds []round, v variant) bool {
	for _, r := range rounds {
		if _, ok := r.pipes[v]; ok {
			return true
		}
	}
	return false
}
