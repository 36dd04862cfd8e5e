package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// riverResult is what one River drain measured (bench/river: bin/river-bench).
type riverResult struct {
	version   string  // River's module version
	jobsPerS  float64 // no-op jobs completed per second
	cpuPerJob float64 // µs of CPU per job (client and backends); 0 if unknown
	text      string  // river-bench's result line
}

// riverLineRE matches river-bench's result line:
//
//	river v0.51.2: 60000 jobs in 2.951 s = 20332 jobs/s; CPU per job 48 µs: client 30, backends 18
var riverLineRE = regexp.MustCompile(`(?m)^river (\S+): [0-9]+ jobs in [0-9.]+ s = ([0-9.]+) jobs/s(?:; CPU per job ([0-9.]+) µs)?`)

// parseRiver reads river-bench's output.
func parseRiver(out string) (riverResult, error) {
	m := riverLineRE.FindStringSubmatch(out)
	if m == nil {
		return riverResult{}, fmt.Errorf("river-bench printed no \"river VERSION: N jobs in S s = R jobs/s\" line:\n%s", out)
	}
	r := riverResult{version: m[1], text: strings.TrimSpace(m[0])}
	var err error
	if r.jobsPerS, err = strconv.ParseFloat(m[2], 64); err != nil {
		return r, fmt.Errorf("river-bench's jobs/s %q: %w", m[2], err)
	}
	if m[3] != "" {
		if r.cpuPerJob, err = strconv.ParseFloat(m[3], 64); err != nil {
			return r, fmt.Errorf("river-bench's CPU per job %q: %w", m[3], err)
		}
	}
	// The whole line, CPU split included, for the round's report.
	if i := strings.Index(out, m[0]); i >= 0 {
		line, _, _ := strings.Cut(out[i:], "\n")
		r.text = line
	}
	return r, nil
}

// runRiver drains as many no-op jobs through River as the pipeline makes hops,
// in the bench's own database (river-bench drops and creates it).
func (b *bench) runRiver(ctx context.Context) (riverResult, error) {
	args := []string{"-n", strconv.Itoa(hopsPerMessage * b.n), "-database", b.server, "-db-name", b.dbName,
		"-timeout", b.timeout.String()}
	cmd := exec.CommandContext(ctx, b.river, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return riverResult{}, fmt.Errorf("%s %s: %w\n%s", b.river, strings.Join(args, " "), err, out.Bytes())
	}
	return parseRiver(out.String())
}
