package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Proves: a queue transaction that waits for a row lock another session
// holds says so while it waits, naming that session (its process id and
// application_name), and the step then commits once the lock is let go.
// Found from outside: a psql session holding queue rows FOR UPDATE stalled
// the whole pipeline for a minute with nothing in the log, and then only
// "queue write failed, holding results and trying again: queue
// transaction: begin: timeout", as if the database had gone.
func TestAStepWaitingForAnotherSessionsLockNamesIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var logs lockedbuf.Buffer
	q := store.New(h.pool, slog.New(slog.NewTextHandler(&logs, nil)))
	q.SetLockWaitAfter(200 * time.Millisecond)
	ids := h.Insert(t, "a", 1)

	ctx := context.Background()
	holder := pgtest.Connect(t, h.url)
	if _, err := holder.Exec(ctx, `SET application_name = 'a-report'`); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, ids[0]).Scan(&pid); err != nil {
		t.Fatal(err)
	}

	done := make(chan []core.Event, 1)
	go func() { done <- q.Exec(ctx, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}}) }()
	want := fmt.Sprintf("holder_pid=%d holder_application_name=a-report", pid)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning naming the holder (%s) while the step waits; log:\n%s", want, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the holder is named, but not as a warning:\n%s", logs.String())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if evs := <-done; errText(evs[0]) != "" {
		t.Errorf("claim %v; want it committed once the lock was let go", evs)
	}
}
