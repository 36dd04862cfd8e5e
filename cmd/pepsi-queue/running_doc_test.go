package main

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// docBlock returns the indented command lines of docs/running.md that follow the
// paragraph containing marker, up to the first blank line.
func docBlock(t *testing.T, marker string) []string {
	t.Helper()
	text, err := os.ReadFile("../../docs/running.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(text), marker)
	if !ok {
		t.Fatalf("docs/running.md has no %q", marker)
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
		t.Fatalf("docs/running.md has no command lines after %q", marker)
	}
	return lines
}

// TestTheHandMadePipelineWorksAsWritten runs docs/running.md's one-stage
// pipeline by hand, line for line, in bash: only the database server, the
// database's name and the stage program are this test's own.
func TestTheHandMadePipelineWorksAsWritten(t *testing.T) {
	t.Parallel()
	lines := docBlock(t, "For example, a one-stage\npipeline by hand")
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := gobuild.Into(bin, "cmd/pepsi-dispatch", "cmd/pepsi-queue", "cmd/pepsi-ingress"); err != nil {
		t.Fatal(err)
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
			t.Errorf("drop the hand-made pipeline's database: %v", err)
		}
	})
	// pepsi-ingress listens on a port of this test's own, not the default.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	script := strings.NewReplacer(
		`\n[stage-first]`, `\n[pepsi-ingress]\nLISTEN = `+listen+`\n[stage-first]`,
		"http://127.0.0.1:8180/", "http://"+listen+"/",
		"/usr/local/bin/first-stage", stage,
		"mydb", db,
		"postgres://postgres@127.0.0.1/", server.String()+"/",
		"createdb -h 127.0.0.1 -U postgres", "createdb -h "+admin.Host+" -p "+strconv.Itoa(int(admin.Port))+" -U "+admin.User,
	).Replace(strings.Join(lines, "\n"))
	// Then wait for both messages (one enqueued, one sent over HTTP) to be
	// done, and stop pepsi-ingress and the dispatcher as docs/running.md's operating
	// section says (SIGTERM): each must exit 0.
	// (The trap stops them if a line fails; "|| true" keeps a clean end's status.)
	script = "set -e\ntrap 'kill %1 %2 2>/dev/null || true' EXIT\n" + script + `
for i in $(seq 1 150); do
	pepsi-queue -c pepsi.conf stats | grep -qE '^first +0 +0 +0 +0 +2 +0 +0 ' && break
	sleep 0.2
done
pepsi-queue -c pepsi.conf stats
pids=$(jobs -p)
kill $pids
for p in $pids; do wait $p; done
`
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	// The page starts programs in the background: whatever happens to the
	// script, nothing it started outlives the test (its process group is killed).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	defer func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH when all ended: nothing to do
		}
	}()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") && !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docs/running.md's commands failed: %v\nscript:\n%s\noutput:\n%s", err, script, out)
	}
	if !strings.Contains(string(out), "enqueued 1") || !strings.Contains(string(out), `{"ids":[2]}`) ||
		!regexp.MustCompile(`(?m)^first +0 +0 +0 +0 +2 +0 +0 `).MatchString(string(out)) {
		t.Fatalf("docs/running.md's pipeline did not finish its two messages; output:\n%s", out)
	}
}
