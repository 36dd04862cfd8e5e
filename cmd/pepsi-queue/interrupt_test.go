package main

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// An operator who stops a long retry with Ctrl-C (or a supervisor with
// SIGTERM) is told it was cancelled, exit 1: then nothing may have changed.
// The retry is one statement; the backend does not notice that its client
// has gone, so unless the tool asks the server to cancel it before it exits,
// it runs on and commits the whole retry after the tool said it was
// cancelled (and without its NOTIFY or the release of its order keys).
func TestAnInterruptedRetryChangesNothing(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	admin := pgtest.Connect(t, url)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, payload, state)
		SELECT 'a', 'failed', 'x', '{"dispatch_error": "exit 1"}' FROM generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	// A session holds the last row, so the retry's UPDATE waits there,
	// midway, as a long retry of a large queue is when an operator stops it.
	holder := pgtest.Connect(t, url)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM pepsi.queue WHERE ingress_id = (SELECT max(ingress_id) FROM pepsi.queue) FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(runCtx, pepsi.Path(t), "-database", url, "retry", "-all")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitForStatement(t, admin, "%dispatch_error_history%", true)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if err == nil || !strings.Contains(stderr.String(), "cancel") {
		t.Errorf("retry -all stopped by SIGINT: %v, stdout %q, stderr %q; want exit 1 saying it was cancelled", err, stdout.String(), stderr.String())
	}
	// The row is free again: a statement still running would now commit.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitForStatement(t, admin, "%dispatch_error_history%", false)
	var failed int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE status = 'failed'`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed != 5 {
		t.Errorf("after a retry -all stopped by SIGINT (exit 1, %q), %d of 5 failed messages are still failed; want all: the retry went on in the server", strings.TrimSpace(stderr.String()), failed)
	}
}
