package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

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
// returning its transactions per second.
func (b *bench) runPgbench(ctx context.Context) (float64, error) {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return 0, fmt.Errorf("connect to the bench database: %w", err)
	}
	_, err = conn.Exec(ctx, "CREATE TABLE bench_commit (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int NOT NULL)")
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return 0, fmt.Errorf("create the pgbench table: %w", err)
	}
	script := filepath.Join(b.dir, "commit.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o600); err != nil {
		return 0, err
	}
	args := []string{"-n", "-c", strconv.Itoa(b.clients), "-j", "2", "-T", strconv.Itoa(b.seconds), "-f", script, b.url}
	cmd := exec.CommandContext(ctx, b.pgbench, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("%s %s: %w\n%s", b.pgbench, strings.Join(args, " "), err, out)
		}
		return 0, fmt.Errorf("run %s: %w", b.pgbench, err)
	}
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no \"tps = … (without initial connection time)\" line:\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}
