package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgbenchPackage names the Debian package that ships pgbench, for the message
// when it is missing.
const pgbenchPackage = "postgresql-15 (or the postgresql-NN of your server; pgbench is in the server package)"

// findPgbench looks in pg_config --bindir, then /usr/lib/postgresql/*/bin
// (newest first), then PATH.
func findPgbench() (string, error) {
	var tried []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "pgbench")
		if isExecutable(p) {
			return p, nil
		}
		tried = append(tried, p)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench") // a bad pattern is impossible here
	for i := len(dirs) - 1; i >= 0; i-- {
		if isExecutable(dirs[i]) {
			return dirs[i], nil
		}
	}
	tried = append(tried, "/usr/lib/postgresql/*/bin/pgbench")
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	tried = append(tried, "pgbench on PATH")
	return "", fmt.Errorf("pgbench not found (tried %s): install the Debian package %s, or use -skip-pgbench",
		strings.Join(tried, ", "), pgbenchPackage)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// pgbenchScript is the one transaction pgbench repeats: a single-row INSERT,
// committed on its own with the server's synchronous_commit.
const pgbenchScript = "INSERT INTO bench_commit (v) VALUES (1);\n"

var tpsRE = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench creates the table and runs pgbench against the bench database,
// returning its transactions per second and, when the server runs on this
// machine, the CPU time one commit took (pgbench's own, and its backends'
// between a quarter and nine tenths of the run; else 0).
func (b *bench) runPgbench(ctx context.Context) (tps float64, perCommit time.Duration, err error) {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return 0, 0, fmt.Errorf("connect to the bench database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err = conn.Exec(ctx, "CREATE TABLE bench_commit (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int NOT NULL)"); err != nil {
		return 0, 0, fmt.Errorf("create the pgbench table: %w", err)
	}
	script := filepath.Join(b.dir, "commit.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return 0, 0, err
	}
	args := []string{"-n", "-c", strconv.Itoa(b.clients), "-j", "2", "-T", strconv.Itoa(b.seconds), "-f", script, b.url}
	cmd := exec.CommandContext(ctx, b.pgbench, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("run %s: %w", b.pgbench, err)
	}
	run := time.Duration(b.seconds) * time.Second
	first, firstOK := sampleCommits(ctx, conn, run/4)
	last, lastOK := sampleCommits(ctx, conn, run*9/10-run/4)
	if err := cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("%s %s: %w\n%s", b.pgbench, strings.Join(args, " "), err, out.Bytes())
	}
	if tps, err = parseTPS(out.Bytes()); err != nil {
		return 0, 0, err
	}
	var total int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM bench_commit").Scan(&total); err != nil {
		return 0, 0, fmt.Errorf("count pgbench's rows: %w", err)
	}
	if firstOK && lastOK && last.commits > first.commits && total > 0 {
		st := cmd.ProcessState
		client := (st.UserTime() + st.SystemTime()) / time.Duration(total)
		perCommit = client + (last.cpu-first.cpu)/time.Duration(last.commits-first.commits)
	}
	return tps, perCommit, nil
}

// commitSample is how many rows pgbench had committed, and how much CPU its
// backends had used, at one instant.
type commitSample struct {
	commits int64
	cpu     time.Duration
}

// sampleCommits waits d, then takes a sample; ok is false if it could not.
func sampleCommits(ctx context.Context, conn *pgx.Conn, d time.Duration) (s commitSample, ok bool) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return s, false
	}
	// The identity's sequence counts the inserts without scanning the table.
	if err := conn.QueryRow(ctx, "SELECT last_value FROM bench_commit_id_seq").Scan(&s.commits); err != nil {
		return s, false
	}
	s.cpu, ok = backendsCPU(ctx, conn)
	return s, ok
}

// parseTPS reads pgbench's "tps = … (without initial connection time)" line.
func parseTPS(out []byte) (float64, error) {
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no \"tps = … (without initial connection time)\" line:\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return 0, fmt.Errorf("pgbench's tps %q: %w", m[1], err)
	}
	return tps, nil
}
