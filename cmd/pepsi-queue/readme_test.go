package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
)

// readmeBlock returns the indented command lines of the README that follow the
// paragraph containing marker, up to the first blank line.
func readmeBlock(t *testing.T, marker string) []string {
	t.Helper()
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(text), marker)
	if !ok {
		t.Fatalf("README.md has no %q", marker)
	}
	_, block, _ := strings.Cut(after, "\n\n")
	var lines []string
	for _, line := range strings.Split(block, "\n") {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(line, "    "))
	}
	if len(lines) == 0 {
		t.Fatalf("README.md has no command lines after %q", marker)
	}
	return lines
}

// TestTheReadmesHandMadePipelineWorksAsWritten runs the README's one-stage
// pipeline by hand, line for line, in bash: only the database server, the
// database's name and the stage program are this test's own.
func TestTheReadmesHandMadePipelineWorksAsWritten(t *testing.T) {
	t.Parallel()
	lines := readmeBlock(t, "For example, a one-stage\npipeline by hand")
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"github.com/pepsi-pipeline/pepsi/cmd/pepsi-dispatch", "github.com/pepsi-pipeline/pepsi/cmd/pepsi-queue").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	stage := filepath.Join(dir, "first-stage")
	if err := os.WriteFile(stage, []byte("#!/bin/sh\nwhile read -r id; do echo '0 >done'; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ParseConfig(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db := "pepsi_readme_" + strconv.FormatInt(time.Now().UnixNano(), 36) // unique across concurrent runs
	server := url.URL{Scheme: "postgres", User: url.User(admin.User), Host: admin.Host + ":" + strconv.Itoa(int(admin.Port))}
	t.Cleanup(func() {
		conn := pgtest.Connect(t, pgtest.AdminURL(t))
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			t.Errorf("drop the README's database: %v", err)
		}
	})
	script := strings.NewReplacer(
		"/usr/local/bin/first-stage", stage,
		"mydb", db,
		"postgres://postgres@127.0.0.1/", server.String()+"/",
		"createdb -h 127.0.0.1 -U postgres", "createdb -h "+admin.Host+" -p "+strconv.Itoa(int(admin.Port))+" -U "+admin.User,
	).Replace(strings.Join(lines, "\n"))
	// Then wait for the message to be done, and stop the dispatcher as the
	// README's operating section says (SIGTERM): it must exit 0.
	script = "set -e\n" + script + `
for i in $(seq 1 150); do
	pepsi-queue -c pepsi.conf stats | grep -qE '^first +0 +0 +0 +1 +0 +0 ' && break
	sleep 0.2
done
pepsi-queue -c pepsi.conf stats
kill %1
wait %1
`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") && !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's commands failed: %v\nscript:\n%s\noutput:\n%s", err, script, out)
	}
	if !strings.Contains(string(out), "enqueued 1") || !regexp.MustCompile(`(?m)^first +0 +0 +0 +1 +0 +0 `).MatchString(string(out)) {
		t.Fatalf("the README's pipeline did not finish its message; output:\n%s", out)
	}
}
